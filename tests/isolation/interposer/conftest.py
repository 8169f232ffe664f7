from pathlib import Path

import pytest

from tests.fakecuda import Container, FakeCuda, fake_cuda_or_skip


@pytest.fixture
def built() -> FakeCuda:
    return fake_cuda_or_skip()


@pytest.fixture
def container(built: FakeCuda, tmp_path: Path) -> Container:
    """One 4 GiB GPU, capped at 1 GiB, with a fresh region."""
    return Container(built, tmp_path / "region")
