"""Regenerates the committed gRPC stubs in src/gpushare/deviceplugin/api/ from proto/.

Run `python -m gpushare.deviceplugin.protogen` (or `scripts/gen-protos`) after editing a
.proto file; tests/deviceplugin/test_protos.py fails while the committed stubs
differ from a fresh generation. Needs grpcio-tools (a dev dependency), pinned
in pyproject.toml because its version is stamped into the generated code.

Both kubelet APIs live in files named `api.proto`, and Python's descriptor pool
refuses two files of one name (docs/contracts.md#proto-files). protoc compiles them
under the virtual include prefix `gpushare/deviceplugin/api/kubelet/`, so each file is
registered under a distinct path that is also its Python import path.
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

PROTO_ROOT: Final = Path(__file__).resolve().parents[3] / "proto"
SOURCE_ROOT: Final = Path(__file__).resolve().parents[2]
PREFIX: Final = "gpushare/deviceplugin/api/kubelet"
PROTOS: Final = ("deviceplugin/v1beta1/api.proto", "podresources/v1/api.proto")


def generate(out_root: Path, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Writes the stubs (and empty package __init__.py files) under out_root;
    returns every file written, relative to out_root."""
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
    written = (out_root / "gpushare/deviceplugin/api").rglob("*.py*")
    return sorted(p.relative_to(out_root) for p in written if p.suffix in (".py", ".pyi"))


def _packages() -> list[Path]:
    """gpushare/deviceplugin/api, …/api/kubelet and every folder down to each proto."""
    packages = {Path("gpushare/deviceplugin/api")}
    for proto in PROTOS:
        folder = Path(PREFIX) / proto
        while folder.parent != Path("gpushare/deviceplugin"):
            folder = folder.parent
            packages.add(folder)
    return sorted(packages)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpushare.deviceplugin.protogen",
        description="Regenerate the device plugin's gRPC stubs from proto/ (needs grpcio-tools).",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=SOURCE_ROOT,
        help=f"source root to write gpushare/deviceplugin/api/ under (default: {SOURCE_ROOT})",
    )
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(args.out / path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
