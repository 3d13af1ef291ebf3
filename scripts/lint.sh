#!/usr/bin/env bash
# Static checks CI runs: ruff over the repository and mypy --strict over specverify/core
# (configuration in pyproject.toml).  `scripts/lint.sh --all` also runs mypy over the whole package
# and the reference decoder, which is not clean yet: it reports, CI does not run it.
# Exits non-zero on any finding of the steps it runs; every step runs, so one run lists them all.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
echo "== ruff check ."
python3 -m ruff check . || status=1
# Only specverify/core is reported here (imports are followed silently).
echo "== mypy --strict specverify/core"
python3 -m mypy --strict --follow-imports=silent specverify/core || status=1
if [ "${1:-}" = "--all" ]; then
    echo "== mypy specverify reference"
    python3 -m mypy specverify reference || status=1
fi
exit "$status"
