import shutil
from collections.abc import Iterator
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


@pytest.fixture
def grant(built: FakeCuda) -> Iterator[Path]:
    """Where the granted interposer reads its grant: the test writes it; it is removed
    afterwards (a file, or the directory a test put there), so no other test sees one."""
    yield built.grant_path
    if built.grant_path.is_dir():
        shutil.rmtree(built.grant_path)
    else:
        built.grant_path.unlink(missing_ok=True)
