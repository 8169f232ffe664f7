import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.deviceplugin.rig import Rig


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory: unix socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="gp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_rig(short_tmp: Path) -> Iterator[Callable[..., Rig]]:
    rigs: list[Rig] = []

    def make(**kwargs) -> Rig:
        rig = Rig(short_tmp / f"r{len(rigs)}", **kwargs)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.stop()
