#!/usr/bin/env bash
# Main job on the embedded default: every contract against the Torch reference backend.
source "$(dirname "$0")/_venv.sh"
.venv/bin/python -m pytest -n auto contracts/ --backend torch "$@"
