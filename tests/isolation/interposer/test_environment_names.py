"""The variables the library reads, and where it reads its grant, are named once, in
gpushare.environment: build.py hands them to the compiler, the C spells none itself."""

import re

from gpushare import environment
from gpushare.isolation.interposer import build
from tests.fakecuda import FakeCuda

READ_BY_THE_LIBRARY = {
    environment.MEM_CONTAINER,
    environment.NVIDIA_VISIBLE_DEVICES,
    environment.CUDA_REGION,
    environment.CUDA_LOG,
}
# Any variable of the families the device plugin and the user set, however spelled.
SPELLED = re.compile(rb"(?:ALIYUN|NVIDIA|GPUSHARE|CGPU)_[A-Z0-9_]*")


def test_every_build_is_handed_the_names_python_defines() -> None:
    handed = dict(define.removeprefix("-D").split("=", 1) for define in build.defines())

    assert set(handed.values()) == {f'"{n}"' for n in READ_BY_THE_LIBRARY} | {
        f'"{environment.GRANT_IN_CONTAINER}"'
    }
    assert '-DGS_GRANT_PATH="/tmp/grant"' in build.defines("/tmp/grant")


def test_the_library_reads_exactly_the_names_python_defines(built: FakeCuda) -> None:
    library = built.interposer.read_bytes()

    assert set(SPELLED.findall(library)) == {n.encode() for n in READ_BY_THE_LIBRARY}
    assert environment.GRANT_IN_CONTAINER.encode() + b"\0" in library


def test_the_test_variant_reads_its_grant_at_its_own_path_only(built: FakeCuda) -> None:
    library = built.granted_interposer.read_bytes()

    assert str(built.grant_path).encode() + b"\0" in library
    assert environment.GRANT_IN_CONTAINER.encode() not in library
