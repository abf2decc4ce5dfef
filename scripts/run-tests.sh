#!/usr/bin/env bash
# The project's tests: lint, then contracts + seeded defects + unit tests (hypothesis `ci` profile under CI=true).
source "$(dirname "$0")/_venv.sh"
.venv/bin/ruff check .
.venv/bin/python -m pytest -n auto contracts/ tests/ "$@"
