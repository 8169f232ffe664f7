#!/usr/bin/env python3
"""Builds the gpushare image without Docker and without any registry.

The image is the one the Dockerfile describes: Debian with Python 3.11, the project
and its dependencies from wheels in a virtual environment at /opt/gpushare (every
console script on PATH), the examples under /usr/share/gpushare/examples, user
10001, `gpushare --help` as the command. Only the base differs: Debian bookworm made
by mmdebstrap from Debian's own packages instead of the python:3.11-slim image (same
Debian release, same Python minor version), because this path must work where no
registry is reachable. tests/test_dockerfile.py holds the two to the same facts.

    scripts/build-image [--tag local/gpushare:dev] [--out FILE.tar] [--import-to SOCK]

Needs root (chroot), mmdebstrap (apt-installed when missing) and the package indexes
of PyPI and Debian. Prints the archive's path; with --import-to, also imports it into
that containerd (namespace k8s.io), so pods can use the tag with imagePullPolicy
Never or IfNotPresent.
"""

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[1]
DIST: Final = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
VENV: Final = "/opt/gpushare"
EXAMPLES: Final = "/usr/share/gpushare/examples"
USER: Final = "10001:10001"
CMD: Final = ("gpushare", "--help")
ENV: Final = (
    f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "PYTHONDONTWRITEBYTECODE=1",
    "PYTHONUNBUFFERED=1",
)
REMOVED_FROM_VENV: Final = ("lib/python3.11/site-packages/kubernetes/aio",)
"""What the components never import, left out of the image (the Dockerfile removes the
same): the Kubernetes client's asyncio copy of itself, 68 MB."""
SUITE: Final = "bookworm"
DEBS: Final = ("python3", "python3-venv", "ca-certificates")
NOT_INSTALLED: Final = (
    "/usr/share/doc/*",
    "/usr/share/man/*",
    "/usr/share/info/*",
    "/usr/share/locale/*",
    "/usr/share/lintian/*",
)
"""dpkg path excludes: documentation nobody reads in a container."""
ENTRY_POINT_CHECK: Final = (
    "import importlib.metadata as m, shutil; "
    f"eps = m.distribution('{DIST}').entry_points.select(group='console_scripts'); "
    "missing = [e.name for e in eps if not shutil.which(e.name)]; "
    "assert not missing, f'console scripts missing: {missing}'; "
    "[e.load() for e in eps]; print('entry points:', ' '.join(sorted(e.name for e in eps)))"
)
"""The Dockerfile's own check: every console script is on PATH and imports."""
EPOCH: Final = 1609459200
"""Timestamp of the archive's metadata files (2021-01-01), for stable digests."""


@dataclass(frozen=True)
class Image:
    archive: Path
    reference: str
    digest: str
    layer_bytes: int
    """Unpacked size of the image's one layer: what it takes on a node."""


def log(message: str) -> None:
    print(f"build-image: {message}", file=sys.stderr, flush=True)


def sh(args: Sequence[str], **kwargs: object) -> None:
    subprocess.run(list(args), check=True, **kwargs)  # type: ignore[call-overload]


def wheels(into: Path) -> None:
    """The project and every runtime dependency as wheels (no extras: no matplotlib)."""
    sh([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(into), str(ROOT)])


def debian(rootfs: Path) -> None:
    if shutil.which("mmdebstrap") is None:
        log("installing mmdebstrap from Debian")
        sh(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "mmdebstrap"],
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            stdout=subprocess.DEVNULL,
        )
    excludes = [f"--dpkgopt=path-exclude={p}" for p in NOT_INSTALLED]
    include = f"--include={','.join(DEBS)}"
    sh(["mmdebstrap", "--quiet", "--variant=minbase", include, *excludes, SUITE, str(rootfs)])


def chroot(rootfs: Path, *args: str) -> None:
    sh(["chroot", str(rootfs), *args], env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})


def install(rootfs: Path, wheelhouse: Path) -> None:
    """What the Dockerfile's runtime stage does, step for step."""
    chroot(rootfs, "groupadd", "--system", "--gid", "10001", "gpushare")
    chroot(
        rootfs, "useradd", "--system", "--uid", "10001", "--gid", "gpushare", "--no-create-home",
        "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", "gpushare",
    )  # fmt: skip
    shutil.copytree(wheelhouse, rootfs / "tmp" / "wheels")
    chroot(rootfs, "/usr/bin/python3", "-m", "venv", VENV)
    pip = f"{VENV}/bin/pip"
    chroot(rootfs, pip, "install", "--quiet", "--no-index", "--find-links", "/tmp/wheels", DIST)
    chroot(rootfs, pip, "uninstall", "--quiet", "--yes", "pip", "setuptools")
    for path in REMOVED_FROM_VENV:
        shutil.rmtree(rootfs / VENV.lstrip("/") / path, ignore_errors=True)
    shutil.rmtree(rootfs / "tmp" / "wheels")
    sh(
        ["chroot", str(rootfs), f"{VENV}/bin/python", "-c", ENTRY_POINT_CHECK],
        env={"PATH": ENV[0].removeprefix("PATH=")},
    )
    shutil.copytree(ROOT / "examples", rootfs / EXAMPLES.lstrip("/"))
    for leftover in ("var/lib/apt/lists", "var/cache/apt", "var/cache/debconf", "var/log"):
        for child in (rootfs / leftover).glob("*"):
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()


def _layer(rootfs: Path) -> bytes:
    """The root filesystem as one tar layer: owners, modes and devices kept, entries in
    a stable order."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as layer:
        for directory, dirs, files in os.walk(rootfs):
            dirs.sort()
            for name in sorted([*dirs, *files]):
                path = Path(directory) / name
                layer.add(path, arcname=str(path.relative_to(rootfs)), recursive=False)
    return buffer.getvalue()


def full_name(reference: str) -> str:
    """The reference as containerd and the kubelet name it: `gpushare/gpushare:V` is
    `docker.io/gpushare/gpushare:V`; a first part with a dot or a port, or `localhost`,
    is a registry and stays (Docker's rule for short names)."""
    first, _, rest = reference.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return reference
    return f"docker.io/{reference}" if rest else f"docker.io/library/{reference}"


def oci_archive(rootfs: Path, reference: str, out: Path) -> Image:
    """An OCI image layout in a tar, as `ctr images import` and `docker load` read it."""
    layer = _layer(rootfs)
    layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": USER,
            "Env": list(ENV),
            "Cmd": list(CMD),
            "WorkingDir": "/",
            "Labels": {
                "org.opencontainers.image.title": DIST,
                "org.opencontainers.image.source": "scripts/build-image (the Dockerfile's image)",
            },
        },
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "created": "2021-01-01T00:00:00Z",
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_digest = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": len(config_bytes),
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": layer_digest,
                "size": len(layer),
            }
        ],
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
    manifest_digest = "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()
    name = full_name(reference)
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": len(manifest_bytes),
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": reference.rsplit(":", 1)[1],
                },
            }
        ],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w") as archive:

        def add(member: str, data: bytes) -> None:
            info = tarfile.TarInfo(member)
            info.size, info.mtime = len(data), EPOCH
            archive.addfile(info, io.BytesIO(data))

        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", json.dumps(index).encode())
        for digest, blob in (
            (layer_digest, layer),
            (config_digest, config_bytes),
            (manifest_digest, manifest_bytes),
        ):
            add("blobs/sha256/" + digest.split(":")[1], blob)
    return Image(out, name, manifest_digest, len(layer))


def build(reference: str, out: Path, wheelhouse: Path | None = None) -> Image:
    if os.geteuid() != 0:
        raise SystemExit("build-image: needs root (mmdebstrap and chroot)")
    if ":" not in reference.rsplit("/", 1)[-1]:
        raise SystemExit(f"build-image: --tag {reference}: give a tag, e.g. {reference}:dev")
    with tempfile.TemporaryDirectory(prefix="gpushare-image-") as work:
        started = time.monotonic()
        if wheelhouse is None:
            wheelhouse = Path(work) / "wheels"
            log("building wheels of the project and its dependencies")
            wheels(wheelhouse)
        rootfs = Path(work) / "rootfs"
        log(f"Debian {SUITE} minbase with {', '.join(DEBS)}")
        debian(rootfs)
        log(f"installing {DIST} into {VENV}")
        install(rootfs, wheelhouse)
        image = oci_archive(rootfs, reference, out)
    log(
        f"{image.reference} {image.digest[:19]}: {image.layer_bytes / 2**20:.0f} MiB unpacked, "
        f"built in {time.monotonic() - started:.0f} s"
    )
    return image


def import_into(image: Image, containerd_socket: Path) -> None:
    sh(
        ["ctr", "--address", str(containerd_socket), "-n", "k8s.io", "images", "import",
         str(image.archive)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/build-image", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--tag", default="local/gpushare:dev", help="image reference")
    parser.add_argument("--out", type=Path, help="archive path (default /tmp/<tag>.tar)")
    parser.add_argument("--wheelhouse", type=Path, help="use these wheels instead of building")
    parser.add_argument(
        "--import-to", type=Path, metavar="SOCK", help="containerd socket to import into"
    )
    args = parser.parse_args(argv)
    out = args.out or Path("/tmp") / (args.tag.replace("/", "_").replace(":", "_") + ".tar")
    image = build(args.tag, out, args.wheelhouse)
    if args.import_to:
        import_into(image, args.import_to)
        log(f"imported into {args.import_to}")
    print(image.archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
