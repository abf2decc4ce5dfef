# Sourced by the two entry scripts: create .venv if missing and (re)install when pyproject.toml changes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
STAMP=.venv/.pto-contracts-installed
WANT="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    # torch is pinned to 2.13.0 in pyproject.toml: the CPU wheel on this machine, never a CUDA download.
    # byte-compiled at install (not --no-compile, which saves 45 s here): where PYTHONDONTWRITEBYTECODE is set, as
    # on these machines, every process would compile torch from source again (CI's pytest took 127 s longer)
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
    echo "$WANT" > "$STAMP"
fi
