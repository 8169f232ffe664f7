"""Regenerates the committed gRPC stubs in src/gpushare/kubeletapi/ from proto/.

Run `python -m gpushare.kubeletapi.protogen` (or `scripts/gen-protos`) after editing a
.proto file; tests/kubeletapi/test_protos.py fails while the committed stubs
differ from a fresh generation. Needs grpcio-tools (a dev dependency), pinned
in pyproject.toml because its version is stamped into the generated code.

Every kubelet API lives in a file named `api.proto`, and Python's descriptor pool
refuses two files of one name (docs/contracts.md#proto-files). protoc compiles them
under the virtual include prefix `gpushare/kubeletapi/`, so each file is
registered under a distinct path that is also its Python import path.
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

PROTO_ROOT: Final = Path(__file__).resolve().parents[3] / "proto"
SOURCE_ROOT: Final = Path(__file__).resolve().parents[2]
PREFIX: Final = "gpushare/kubeletapi"
PROTOS: Final = (
    "deviceplugin/v1beta1/api.proto",
    "podresources/v1/api.proto",
    "pluginregistration/v1/api.proto",
    "dra/v1/api.proto",
    "dra/v1beta1/api.proto",
    "dra/health/v1alpha1/api.proto",
)


def generate(out_root: Path, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Writes the stubs (and empty package __init__.py files) under out_root;
    returns every generated file, relative to out_root (not protogen.py and the
    package's own __init__.py, which are written by hand)."""
    from grpc_tools import protoc  # dev dependency: only the generator needs it

    out_root.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{PREFIX}={proto_root}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *(f"{PREFIX}/{proto}" for proto in PROTOS),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {', '.join(PROTOS)} under {proto_root}")
    for package in _packages():
        init = out_root / package / "__init__.py"
        if not init.exists():
            init.write_text("")
    return sorted(
        p.relative_to(out_root)
        for top in _top_folders()
        for p in (out_root / PREFIX / top).rglob("*.py*")
        if p.suffix in (".py", ".pyi")
    )


def _top_folders() -> list[str]:
    """deviceplugin, podresources, …: the folders the stubs go in."""
    return sorted({proto.split("/", 1)[0] for proto in PROTOS})


def _packages() -> list[Path]:
    """Every folder between gpushare/kubeletapi and each proto (not kubeletapi itself)."""
    packages = set()
    for proto in PROTOS:
        folder = Path(PREFIX) / proto
        while folder.parent != Path(PREFIX):
            folder = folder.parent
            packages.add(folder)
    return sorted(packages)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpushare.kubeletapi.protogen",
        description="Regenerate the kubelet APIs' gRPC stubs from proto/ (needs grpcio-tools).",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=SOURCE_ROOT,
        help=f"source root to write {PREFIX}/ under (default: {SOURCE_ROOT})",
    )
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(args.out / path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
