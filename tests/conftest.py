"""Every test runs with the node binaries' interposer directory in a temporary directory:
their default, /var/lib/gpushare/interposer, is the node's, which a test must neither
write (the agent installs the library there) nor read (the device plugin injects what
it finds there)."""

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def _interposer_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    before = os.environ.get("GPUSHARE_INTERPOSER_DIR")
    os.environ["GPUSHARE_INTERPOSER_DIR"] = str(tmp_path_factory.mktemp("interposer"))
    yield
    if before is None:
        os.environ.pop("GPUSHARE_INTERPOSER_DIR", None)
    else:
        os.environ["GPUSHARE_INTERPOSER_DIR"] = before
