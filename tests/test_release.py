"""scripts/release on the checkout (without the image: that needs root and a minute;
the chart tier makes the release with it): every artifact, checksums that verify, the
one version everywhere, and the wheel installed into a fresh venv running each console
script's --version."""

import hashlib
import importlib.util
import io
import subprocess
import sys
import tarfile
import time
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.e2e import results

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
SCRIPTS = sorted(PYPROJECT["project"]["scripts"])

pytestmark = pytest.mark.timeout(600)


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


release = _script("release")
build_image = _script("build_image")


def _release(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "release.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _head() -> str:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True)
    return head.stdout.decode().strip() if head.returncode == 0 else ""


@pytest.fixture(scope="session")
def tier_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the real-cluster tiers would have recorded for HEAD: both tiers passed on
    v1.33.3; on v1.28.7 the chart tier failed a test."""
    directory = tmp_path_factory.mktemp("e2e-results")
    for tier, version, passed, failed in [
        ("real-cluster", "v1.33.3", 41, 0),
        ("chart", "v1.33.3", 12, 0),
        ("real-cluster", "v1.28.7", 41, 0),
        ("chart", "v1.28.7", 11, 1),
    ]:
        results.record(directory, _head() or "none", False, tier, version, passed, failed)
    return directory


@pytest.fixture(scope="session")
def made(tmp_path_factory: pytest.TempPathFactory, tier_results: Path) -> Path:
    out = tmp_path_factory.mktemp("release")
    started = time.monotonic()
    result = _release("--no-image", "--out", str(out), "--tier-results", str(tier_results))
    assert result.returncode == 0, result.stderr
    print(f"\nscripts/release --no-image: {time.monotonic() - started:.1f}s")
    return out


def test_the_release_makes_every_artifact_and_the_checksums_verify(made: Path):
    [wheel] = made.glob(f"kube_gpushare-{VERSION}-*.whl")
    expected = {
        wheel.name, f"kube_gpushare-{VERSION}.tar.gz", f"gpushare-{VERSION}.tgz", "index.yaml",
        "SHA256SUMS", "RELEASE-NOTES.md",
    }  # fmt: skip
    assert {p.name for p in made.iterdir()} == expected
    checked = subprocess.run(
        ["sha256sum", "--check", "--strict", "SHA256SUMS"],
        cwd=made, capture_output=True, text=True, check=True,
    )  # fmt: skip
    verified = {line.rsplit(": ", 1)[0] for line in checked.stdout.splitlines()}
    assert verified == expected - {"SHA256SUMS", "RELEASE-NOTES.md"}


def test_the_packaged_chart_carries_the_one_version(made: Path):
    with tarfile.open(made / f"gpushare-{VERSION}.tgz") as chart:
        metadata = yaml.safe_load(chart.extractfile("gpushare/Chart.yaml"))  # type: ignore[arg-type]
    assert (metadata["version"], metadata["appVersion"]) == (VERSION, VERSION)


def test_the_index_names_the_packaged_chart_with_its_digest(made: Path):
    tgz = made / f"gpushare-{VERSION}.tgz"
    [entry] = yaml.safe_load((made / "index.yaml").read_text())["entries"]["gpushare"]
    assert entry["urls"] == [tgz.name]
    assert entry["version"] == entry["appVersion"] == VERSION
    assert entry["digest"] == hashlib.sha256(tgz.read_bytes()).hexdigest()


def test_the_notes_list_each_artifact_with_its_checksum_and_say_the_image_is_left_out(
    made: Path,
):
    notes = (made / "RELEASE-NOTES.md").read_text()
    assert notes.startswith(f"# gpushare {VERSION}\n")
    for line in (made / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ")
        assert f"| `{name}` |" in notes and f"`{digest}`" in notes
    assert "--no-image" in notes
    if _head():
        assert f"Made from commit `{_head()}`" in notes
        assert "Tested on Kubernetes v1.33.3 (" in notes  # the tiers' record for HEAD
        assert "- v1.28.7: chart tier: 11 passed, 1 failed; real-cluster tier: 41 passed" in notes
    assert "pip install kube-gpushare" not in notes


def test_the_wheel_in_a_fresh_venv_runs_each_console_scripts_version(made: Path, tmp_path: Path):
    [wheel] = made.glob("*.whl")
    venv = tmp_path / "venv"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # --no-compile: byte-compiling the dependencies (the Kubernetes client most) is a
    # third of the install, and imports write what they need anyway.
    installed = subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--no-compile", str(wheel)],
        capture_output=True, text=True, timeout=480,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-2000:]
    print(f"\nfresh venv + pip install of the wheel: {time.monotonic() - started:.1f}s")
    for script in SCRIPTS:
        shown = subprocess.run(
            [venv / "bin" / script, "--version"], capture_output=True, text=True, timeout=60
        )
        assert shown.returncode == 0, f"{script}: {shown.stderr}"
        assert shown.stdout.strip().endswith(f" {VERSION}"), f"{script}: {shown.stdout!r}"


def test_chart_yaml_in_the_tree_has_the_projects_version():
    """`helm install helm/gpushare` from the source tree agrees with the release's chart
    and the image tag: bump all three together (docs/releasing.md)."""
    chart = yaml.safe_load((ROOT / "helm" / "gpushare" / "Chart.yaml").read_text())
    assert chart["version"] == VERSION, "Chart.yaml version differs from pyproject.toml's"
    assert chart["appVersion"] == VERSION, "Chart.yaml appVersion differs from pyproject.toml's"


COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_the_notes_name_the_versions_every_tier_passed_on_for_the_commit(tmp_path: Path):
    """No Kubernetes ships with the repository: what is tested is what the tiers ran."""
    results.record(tmp_path, COMMIT, False, "real-cluster", "v1.33.3", 41, 0)
    results.record(tmp_path, COMMIT, False, "chart", "v1.33.3", 12, 0)
    results.record(tmp_path, COMMIT, False, "real-cluster", "v1.31.0", 40, 0)

    text = release.tested_text(tmp_path, COMMIT)

    assert text.splitlines()[0].startswith("Tested on Kubernetes v1.31.0 and v1.33.3 (")
    assert "- v1.33.3: chart tier: 12 passed, 0 failed; real-cluster tier: 41 passed" in text


def test_without_a_record_for_the_commit_the_notes_say_the_tier_did_not_run(tmp_path: Path):
    results.record(tmp_path, "another" + COMMIT[7:], False, "real-cluster", "v1.33.3", 41, 0)

    for commit in (COMMIT, ""):
        text = release.tested_text(tmp_path, commit)
        assert text.startswith("**The real-cluster tier did not run for this commit**")
        assert "Tested on" not in text and "v1.33.3" not in text


def test_a_failed_run_or_one_on_a_changed_tree_is_not_claimed(tmp_path: Path):
    results.record(tmp_path, COMMIT, False, "real-cluster", "v1.33.3", 40, 1)
    results.record(tmp_path, COMMIT, True, "real-cluster", "v1.31.0", 41, 0)

    text = release.tested_text(tmp_path, COMMIT)

    assert text.splitlines()[0].startswith("**No Kubernetes version is claimed as tested**")
    assert "- v1.31.0: real-cluster tier: 41 passed, 0 failed, on a tree with uncommitted" in text
    assert "- v1.33.3: real-cluster tier: 40 passed, 1 failed" in text


def test_a_later_run_replaces_its_tier_and_versions_entry(tmp_path: Path):
    results.record(tmp_path, COMMIT, False, "real-cluster", "v1.33.3", 40, 1)
    path = results.record(tmp_path, COMMIT, False, "real-cluster", "v1.33.3", 41, 0)

    assert path == tmp_path / f"{COMMIT}.json"
    assert release.tested_text(tmp_path, COMMIT).startswith("Tested on Kubernetes v1.33.3 (")


def test_an_out_directory_holding_other_files_is_refused_and_kept(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("mine")
    result = _release("--no-image", "--out", str(tmp_path))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"release: --out {tmp_path}: not empty and not an earlier release"
    ]
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_without_root_the_release_says_to_pass_no_image(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(release.os, "geteuid", lambda: 1000)
    assert "--no-image" in release.missing(with_image=True)
    assert release.missing(with_image=False) is None


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc" / "hostname").write_text("gpushare\n")
    out = tmp_path / "image.oci.tar"
    build_image.oci_archive(rootfs, f"gpushare/gpushare:{VERSION}", out)
    return out


def test_the_image_archive_is_read_back_as_an_oci_layout_with_its_manifest_digest(
    archive: Path,
):
    oci = release.read_oci_archive(archive)
    assert oci.reference == f"docker.io/gpushare/gpushare:{VERSION}"
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        assert {"oci-layout", "index.json"} <= names
        manifest = tar.extractfile("blobs/sha256/" + oci.digest.removeprefix("sha256:"))
        assert manifest is not None and b'"layers"' in manifest.read()


def test_an_image_archive_whose_blob_fails_its_digest_is_refused(archive: Path, tmp_path: Path):
    broken = tmp_path / "broken.tar"
    with tarfile.open(archive) as source, tarfile.open(broken, "w") as target:
        for member in source.getmembers():
            data = source.extractfile(member).read()  # type: ignore[union-attr]
            if member.name.startswith("blobs/") and b"hostname" in data:
                data = data.replace(b"gpushare\n", b"gpushark\n")
            target.addfile(member, io.BytesIO(data))
    with pytest.raises(release.ReleaseError, match="fails its digest"):
        release.read_oci_archive(broken)


@pytest.mark.parametrize(
    ("reference", "name"),
    [
        ("gpushare/gpushare:1.0", "docker.io/gpushare/gpushare:1.0"),
        ("docker.io/gpushare/gpushare:1.0", "docker.io/gpushare/gpushare:1.0"),
        ("busybox:1", "docker.io/library/busybox:1"),
        ("registry.example:5000/team/gpushare:1.0", "registry.example:5000/team/gpushare:1.0"),
        ("localhost/gpushare:1.0", "localhost/gpushare:1.0"),
    ],
)
def test_the_archive_names_the_image_as_containerd_and_the_kubelet_do(reference, name):
    assert build_image.full_name(reference) == name
