"""Builds a bench's Go program (the kubelet's or kube-scheduler's side, in the language
they are written in), or says why it cannot be built here."""

import os
import shutil
import subprocess
from pathlib import Path


def go_build(source: Path, binary: Path, env: dict[str, str], needs: str = "") -> Path | str:
    """`go build` of the package in `source` into `binary` with these environment
    variables added; the binary, or why not (`needs` names what a failed build may
    lack, for the message)."""
    go = shutil.which("go")
    if go is None:
        return f"no `go` on PATH (Debian: apt-get install golang-go{needs and ' ' + needs})"
    built = subprocess.run(
        [go, "build", "-o", str(binary), "."],
        cwd=source,
        env={"GOCACHE": str(binary.parent / "gocache"), **os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        last = (built.stderr.strip().splitlines() or ["no output"])[-1]
        why = f"; it needs {needs}" if needs else ""
        return f"`go build` failed ({last}){why}"
    return binary
