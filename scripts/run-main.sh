#!/usr/bin/env bash
# Main job on the embedded default: every contract (including the replay of artifacts/store) against the
# Torch reference backend, then the golden store's verdict table (and its replay on the emulated twin).
source "$(dirname "$0")/_venv.sh"
.venv/bin/python -m pytest -n auto contracts/ --backend torch "$@"
.venv/bin/goldens --store artifacts/store replay --backend torch
.venv/bin/goldens --store artifacts/store replay --backend emulated
