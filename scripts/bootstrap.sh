# Sourced by scripts/demo and scripts/test: makes .venv with the project installed.
# Re-installs only when pyproject.toml changed since the last install.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

pick_python() {
  for candidate in python3.11 python3.12 python3.13 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  echo "gpushare needs Python >= 3.11 on PATH" >&2
  return 1
}

if [ ! -x .venv/bin/python ]; then
  "$(pick_python)" -m venv .venv
fi
stamp=.venv/.gpushare-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[dev]"
  echo "$want" > "$stamp"
fi
export PATH="$root/.venv/bin:$PATH"
