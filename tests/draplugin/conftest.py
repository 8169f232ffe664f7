import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.draplugin.rig import DraNode


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory: unix socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="gd-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def node(short_tmp: Path) -> Iterator[DraNode]:
    node = DraNode(short_tmp)
    yield node
    node.stop()
