#!/usr/bin/env bash
# Former name of the test set-up, kept for the messages that still name it: the user's install is
# `pip install -e .` (no root); the tests' extra packages come from scripts/setup-tests.sh.
set -euo pipefail
exec bash "$(dirname "$0")/setup-tests.sh" "$@"
