#!/usr/bin/env python3
"""Makes the release artifacts of the checkout's version into one directory.

    scripts/release [--out dist/release] [--no-image]

For version V (pyproject.toml's `version`, the one source of it):
  kube_gpushare-V-*.whl, kube_gpushare-V.tar.gz   python -m build (the wheel from the sdist)
  gpushare-V.tgz, index.yaml                      Helm's own `package` and `repo index`
                                                  (helm-python-sdk), version and appVersion V
  gpushare-image-V.oci.tar, gpushare-image-V.digest
                                                  scripts/build_image.py from the wheel above,
                                                  docker.io/gpushare/gpushare:V
  SHA256SUMS, RELEASE-NOTES.md

The notes name the Kubernetes versions the real-cluster tiers passed on for this
commit, as they recorded it (tests/e2e/results.py, --tier-results), or say plainly
that they did not run for it. The image needs root (mmdebstrap and chroot): --no-image
leaves it out, and the notes say so. Anything missing stops the release with one line
and exit status 1.
"""

import argparse
import hashlib
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
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[1]
CHART_DIR: Final = ROOT / "helm" / "gpushare"
DEFAULT_OUT: Final = ROOT / "dist" / "release"
IMAGE_REPOSITORY: Final = "docker.io/gpushare/gpushare"
"""The chart's default image (values.yaml `image.repository`, tag = appVersion): the
archive carries this name, so a node that imported it runs the chart's defaults."""
TIER_RESULTS: Final = Path(
    os.environ.get("GPUSHARE_E2E_RESULTS", str(ROOT / "dist" / "e2e-results"))
)
"""Where the real-cluster tiers record, per commit, the Kubernetes versions they ran on
(`<commit>.json`, written by tests/e2e/results.py)."""
SUMS: Final = "SHA256SUMS"
NOTES: Final = "RELEASE-NOTES.md"


class ReleaseError(Exception):
    """Something the release needs is missing: one line for the operator."""


@dataclass(frozen=True)
class Names:
    """The artifacts' file names for one version (docs/install.md uses the same)."""

    version: str

    @property
    def sdist(self) -> str:
        return f"kube_gpushare-{self.version}.tar.gz"

    @property
    def wheel_glob(self) -> str:
        return f"kube_gpushare-{self.version}-*.whl"

    @property
    def chart(self) -> str:
        return f"gpushare-{self.version}.tgz"

    @property
    def index(self) -> str:
        return "index.yaml"

    @property
    def image(self) -> str:
        return f"gpushare-image-{self.version}.oci.tar"

    @property
    def digest(self) -> str:
        return f"gpushare-image-{self.version}.digest"

    @property
    def image_reference(self) -> str:
        return f"{IMAGE_REPOSITORY}:{self.version}"


@dataclass(frozen=True)
class OciImage:
    reference: str
    digest: str
    """The manifest's digest: what a registry and containerd name the image by."""
    layer_bytes: int


@dataclass(frozen=True)
class Release:
    version: str
    directory: Path
    files: tuple[Path, ...]
    """Every artifact, SHA256SUMS and the notes last."""
    image: OciImage | None


def log(message: str) -> None:
    print(f"release: {message}", file=sys.stderr, flush=True)


def project_version(root: Path = ROOT) -> str:
    """pyproject.toml's version: the package's, the chart's version and appVersion, the
    image tag."""
    return str(tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"])


# ----- preflight


def missing(with_image: bool) -> str | None:
    """Why the release cannot be made here, or None. Checked before anything is built."""
    for module, extra in (("build", "build"), ("helm_python", "helm-python-sdk")):
        try:
            __import__(module)
        except ImportError:
            return f"needs the python package {extra} (pip install -e '.[dev]')"
    if with_image:
        if os.geteuid() != 0:
            return "the image needs root (mmdebstrap and chroot): run as root, or pass --no-image"
        if shutil.which("mmdebstrap") is None and shutil.which("apt-get") is None:
            return "the image needs mmdebstrap (or apt-get to install it), or pass --no-image"
    return None


def prepare(out: Path) -> None:
    """An empty output directory. A non-empty one is emptied only if it holds an earlier
    release (its SHA256SUMS), so a mistyped --out never deletes someone's files."""
    if out.exists() and any(out.iterdir()):
        if not (out / SUMS).is_file() and out != DEFAULT_OUT:
            raise ReleaseError(f"--out {out}: not empty and not an earlier release")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


# ----- the artifacts


def python_distributions(names: Names, out: Path) -> Path:
    """The sdist, then the wheel built from it (as pip builds from the sdist): a file the
    sdist lacks fails here, not on a user's machine. Returns the wheel."""
    with tempfile.TemporaryDirectory(prefix="gpushare-build-") as scratch:
        result = subprocess.run(
            [sys.executable, "-m", "build", "--outdir", scratch, str(ROOT)],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            sys.stderr.write(result.stdout[-4000:] + result.stderr[-4000:])
            raise ReleaseError("python -m build failed (its output is above)")
        for built in Path(scratch).iterdir():
            shutil.move(built, out / built.name)
    wheels = sorted(out.glob(names.wheel_glob))
    if len(wheels) != 1 or not (out / names.sdist).is_file():
        made = sorted(p.name for p in out.iterdir())
        raise ReleaseError(f"python -m build made {made}, not {names.sdist} and one wheel")
    return wheels[0]


def chart(names: Names, out: Path) -> tuple[Path, Path]:
    """helm package with version and appVersion stamped from the one version, and the
    chart repository's index.yaml beside it (entries relative to the directory)."""
    import helm_python.chart
    import helm_python.registry

    packaged = Path(
        helm_python.chart.package(
            CHART_DIR, destination=out, version=names.version, app_version=names.version
        )
    )
    if packaged.name != names.chart:
        raise ReleaseError(f"helm package wrote {packaged.name}, not {names.chart}")
    helm_python.registry.repo_index_generate(out)
    return packaged, out / names.index


def image(names: Names, out: Path, wheel: Path) -> tuple[Path, Path, OciImage]:
    """The Dockerfile's image, built offline by scripts/build_image.py from the released
    wheel (and its dependencies' wheels), tagged with the version."""
    import build_image  # beside this script: on sys.path when it runs as scripts/release

    with tempfile.TemporaryDirectory(prefix="gpushare-wheelhouse-") as wheelhouse:
        log("wheels of the released wheel's dependencies for the image")
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", wheelhouse,
             str(wheel)],
            check=True,
        )  # fmt: skip
        archive = out / names.image
        build_image.build(names.image_reference, archive, Path(wheelhouse))
    oci = read_oci_archive(archive)
    if oci.reference != names.image_reference:
        raise ReleaseError(f"{archive.name} names {oci.reference}, not {names.image_reference}")
    digest_file = out / names.digest
    digest_file.write_text(oci.digest + "\n")
    return archive, digest_file, oci


def read_oci_archive(archive: Path) -> OciImage:
    """What `ctr images import` and `kind load image-archive` read: an OCI image layout
    (oci-layout, index.json, blobs/sha256/) in a tar, one manifest named by its
    io.containerd.image.name annotation, each blob matching its digest."""
    with tarfile.open(archive) as tar:

        def member(name: str) -> bytes:
            file = tar.extractfile(name)
            if file is None:
                raise ReleaseError(f"{archive.name}: {name} is not a file")
            return file.read()

        def blob(descriptor: dict[str, Any]) -> bytes:
            algorithm, hexdigest = str(descriptor["digest"]).split(":", 1)
            data = member(f"blobs/{algorithm}/{hexdigest}")
            if algorithm != "sha256" or hashlib.sha256(data).hexdigest() != hexdigest:
                raise ReleaseError(f"{archive.name}: blob {hexdigest[:12]} fails its digest")
            return data

        try:
            layout = json.loads(member("oci-layout"))
            index = json.loads(member("index.json"))
        except KeyError as error:
            raise ReleaseError(f"{archive.name} is not an OCI layout: no {error}") from None
        if layout.get("imageLayoutVersion") != "1.0.0" or len(index["manifests"]) != 1:
            raise ReleaseError(f"{archive.name}: not an OCI layout of one image")
        [descriptor] = index["manifests"]
        manifest = json.loads(blob(descriptor))
        blob(manifest["config"])
        layers = [len(blob(layer)) for layer in manifest["layers"]]
    return OciImage(
        reference=descriptor.get("annotations", {}).get("io.containerd.image.name", ""),
        digest=str(descriptor["digest"]),
        layer_bytes=sum(layers),
    )


# ----- what says what the release is


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def checksums(out: Path, files: Sequence[Path]) -> Path:
    """`sha256sum -c` reads it: `<hex>  <name>` per line, names relative to the file."""
    sums = out / SUMS
    sums.write_text("".join(f"{sha256(f)}  {f.name}\n" for f in files))
    return sums


def _git(*args: str) -> str:
    result = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else ""


def source_commit() -> str:
    """The commit the release was made from, and whether the tree differed from it."""
    commit = _git("rev-parse", "HEAD")
    if not commit:
        return "a source tree outside git"
    changed = _git("status", "--porcelain", "--untracked-files=no")
    return f"commit `{commit}`" + (" **with uncommitted changes**" if changed else "")


def tested_text(results: Path, commit: str) -> str:
    """What the notes say of the Kubernetes versions tested: those on which every
    real-cluster tier that ran for `commit` passed, on a tree without changes, from the
    tiers' record; or that the tier did not run for this commit."""
    path = results / f"{commit}.json"
    try:
        tiers = json.loads(path.read_text())["tiers"] if commit else {}
    except (OSError, ValueError, KeyError, TypeError):
        tiers = {}
    by_version: dict[str, list[str]] = {}
    counted: dict[str, bool] = {}
    for tier, versions in sorted(tiers.items()):
        for version, run in sorted(versions.items()):
            ok = run["failed"] == 0 and run["passed"] > 0 and not run["tree_changed"]
            changed = ", on a tree with uncommitted changes" if run["tree_changed"] else ""
            by_version.setdefault(version, []).append(
                f"{tier} tier: {run['passed']} passed, {run['failed']} failed{changed}"
            )
            counted[version] = counted.get(version, True) and ok
    if not by_version:
        return (
            "**The real-cluster tier did not run for this commit** (no record of it in "
            f"`{path.name}`): no Kubernetes version is claimed as tested."
        )
    passed = [v for v in sorted(by_version) if counted[v]]
    what = (
        "what the real-cluster tiers ran for this commit: the chart and our parts on a real "
        "kube-apiserver, kube-scheduler and kubelet"
    )
    lines = [
        f"Tested on Kubernetes {' and '.join(passed)} ({what})."
        if passed
        else f"**No Kubernetes version is claimed as tested**: no run passed cleanly ({what})."
    ]
    lines += [f"- {v}: {'; '.join(by_version[v])}" for v in sorted(by_version)]
    return "\n".join(lines)


def notes_text(
    names: Names, files: Sequence[Path], oci: OciImage | None, results: Path = TIER_RESULTS
) -> str:
    rows = "\n".join(
        f"| `{f.name}` | {human_size(f.stat().st_size)} | `{sha256(f)}` |" for f in files
    )
    if oci is None:
        image_part = (
            "**No image in this release** (made with `--no-image`). Build it from the source "
            f"tree: `docker build -t gpushare/gpushare:{names.version} .` or, as root, "
            f"`scripts/build-image --tag gpushare/gpushare:{names.version}` (docs/install.md)."
        )
        load = ""
    else:
        image_part = (
            f"Image `{oci.reference}`, manifest digest `{oci.digest}` "
            f"({human_size(oci.layer_bytes)} unpacked). It is published to no registry: "
            "load the archive on each node, or push it to yours."
        )
        load = (
            f"sudo ctr -n k8s.io images import {names.image}     # on every node\n"
            f"# or: kind load image-archive {names.image} --name CLUSTER\n"
            f"# or: skopeo copy oci-archive:{names.image} docker://REGISTRY/gpushare:"
            f"{names.version}  (then --set image.repository=REGISTRY/gpushare)\n"
        )
    tested = tested_text(results, _git("rev-parse", "HEAD"))
    return f"""# gpushare {names.version}

GPU sharing for Kubernetes, wire-compatible with Alibaba Cloud ACK's shared-GPU model (cGPU).
Made from {source_commit()}.

## Artifacts

| File | Size | SHA-256 |
|---|---|---|
{rows}

Check them with `sha256sum -c {SUMS}`.

{image_part}

{tested}

## Install

docs/install.md ("Install from a release") is the full path; in short:

```sh
sha256sum -c {SUMS}
{load}helm install gpushare ./{names.chart} -n gpushare-system --create-namespace
kubectl label node NODE ack.node.gpu.schedule=cgpu
pip install ./{names.wheel_glob}       # kubectl inspect cgpu, gpushare simulate
```
"""


def human_size(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    if size < 1024**2:
        return f"{size / 1024:.1f} KiB"
    return f"{size / 1024**2:.1f} MiB"


# ----- the whole release


def make(out: Path, with_image: bool, results: Path = TIER_RESULTS) -> Release:
    reason = missing(with_image)
    if reason:
        raise ReleaseError(reason)
    names = Names(project_version())
    prepare(out)
    try:
        return _make(names, out, with_image, results)
    except BaseException:
        # No half release: what is left in --out is always a whole one, or nothing.
        shutil.rmtree(out, ignore_errors=True)
        raise


def _make(names: Names, out: Path, with_image: bool, results: Path) -> Release:
    log(f"version {names.version} into {out}")
    wheel = python_distributions(names, out)
    log(f"{wheel.name}, {names.sdist}")
    packaged, index = chart(names, out)
    log(f"{packaged.name}, {index.name}")
    files = [wheel, out / names.sdist, packaged, index]
    oci = None
    if with_image:
        archive, digest_file, oci = image(names, out, wheel)
        files += [archive, digest_file]
        log(f"{archive.name} ({oci.reference} {oci.digest})")
    sums = checksums(out, files)
    notes = out / NOTES
    notes.write_text(notes_text(names, files, oci, results))
    return Release(names.version, out, (*files, sums, notes), oci)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/release", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="directory (default dist/release)"
    )
    parser.add_argument(
        "--no-image", action="store_true", help="leave the image out (it needs root)"
    )
    parser.add_argument(
        "--tier-results",
        type=Path,
        default=TIER_RESULTS,
        help="where the real-cluster tiers recorded their runs per commit (default "
        "dist/e2e-results, or GPUSHARE_E2E_RESULTS)",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        release = make(args.out.resolve(), not args.no_image, args.tier_results)
    except ReleaseError as error:
        print(f"release: {error}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as error:
        command = " ".join(str(a) for a in error.cmd[:4])
        print(f"release: {command} ... failed (exit {error.returncode})", file=sys.stderr)
        return 1
    for path in release.files:
        print(f"{human_size(path.stat().st_size):>10}  {path}")
    took = time.monotonic() - started
    image_note = "" if release.image else ", without the image (--no-image)"
    print(f"gpushare {release.version}: {len(release.files)} files in {took:.0f} s{image_note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
