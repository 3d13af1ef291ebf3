#!/usr/bin/env bash
# Static checks CI runs: ruff over the repository, mypy --strict over specverify/core and mypy over
# the whole package and the reference decoder (configuration in pyproject.toml).
# Exits non-zero on any finding of the steps it runs; every step runs, so one run lists them all.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
echo "== ruff check ."
python3 -m ruff check . || status=1
# Only specverify/core is reported here (imports are followed silently).
echo "== mypy --strict specverify/core"
python3 -m mypy --strict --follow-imports=silent specverify/core || status=1
echo "== mypy specverify reference"
python3 -m mypy specverify reference || status=1
exit "$status"
