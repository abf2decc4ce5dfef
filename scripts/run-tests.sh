#!/usr/bin/env bash
# The project's tests: lint, then contracts + seeded defects + unit tests (hypothesis `ci` profile under CI=true).
# tests/ first and --dist worksteal: the long subprocess tests of tests/ start at once and the many short
# contracts fill the tail, so neither of the 2 workers idles at the end waiting for the other's 50-s test.
source "$(dirname "$0")/_venv.sh"
.venv/bin/ruff check .
.venv/bin/python -m pytest -n auto --dist worksteal tests/ contracts/ "$@"
