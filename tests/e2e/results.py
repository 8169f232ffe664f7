"""What the real-cluster tiers ran on, per commit: the record scripts/release reads.

When a tier's cluster goes down, the tier records for the checkout's commit (`git
rev-parse HEAD`) how many of its tests passed and failed on that Kubernetes version,
and whether the tree had uncommitted changes, in `<results>/<commit>.json`:

    {"commit": "<sha>", "tiers": {"real-cluster": {"v1.33.3": {"passed": 41, "failed": 0,
     "tree_changed": false, "finished": "2026-11-22T12:00:00+00:00"}}}}

Later runs on the same commit replace their tier and version's entry. A tier that
skipped (no binaries, not root) records nothing: the release then says it did not run.
GPUSHARE_E2E_RESULTS names the directory (default dist/e2e-results of the checkout).
"""

import contextlib
import datetime
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[2]
DEFAULT_RESULTS: Final = ROOT / "dist" / "e2e-results"


def results_dir() -> Path:
    return Path(os.environ.get("GPUSHARE_E2E_RESULTS", str(DEFAULT_RESULTS)))


def checkout() -> tuple[str, bool] | None:
    """The commit of the checkout and whether tracked files differ from it; None outside git."""

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)

    head = git("rev-parse", "HEAD")
    if head.returncode != 0:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return head.stdout.strip(), bool(status.stdout.strip())


def record(
    directory: Path,
    commit: str,
    tree_changed: bool,
    tier: str,
    version: str,
    passed: int,
    failed: int,
) -> Path:
    """Writes (or updates) the commit's record with one tier's run on one version."""
    path = directory / f"{commit}.json"
    data: dict[str, Any] = {"commit": commit, "tiers": {}}
    if path.is_file():
        with contextlib.suppress(ValueError):  # a damaged record is replaced by this run's
            data = json.loads(path.read_text())
    data.setdefault("tiers", {}).setdefault(tier, {})[version] = {
        "passed": passed,
        "failed": failed,
        "tree_changed": tree_changed,
        "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    directory.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    partial.replace(path)
    return path


def record_run(tier: str, version: str, passed: int, failed: int) -> str:
    """Records the run for the checkout's commit; a line saying where, or why not."""
    found = checkout()
    if found is None:
        return f"{tier} tier on {version}: not recorded (the checkout is not a git tree)"
    commit, changed = found
    try:
        path = record(results_dir(), commit, changed, tier, version, passed, failed)
    except OSError as err:
        return f"{tier} tier on {version}: not recorded ({err})"
    return f"{tier} tier on {version}: {passed} passed, {failed} failed, recorded in {path}"
