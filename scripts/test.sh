#!/usr/bin/env bash
# Installs (the package, then the tools outside Python the tests use: scripts/test-tools.sh, as
# CI does), runs the gates (lint, format, types, the docs build), then the whole test suite.
# Extra arguments go to pytest. Any finding of ruff or mypy fails the run before a test starts.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
bash scripts/test-tools.sh
SOURCES=(skygreen tasks benchmarks tests scripts docs/hooks)
.venv/bin/ruff check "${SOURCES[@]}"
.venv/bin/ruff format --check "${SOURCES[@]}"
.venv/bin/mypy
# The documentation site: a broken link, a missing page or a docstring mkdocstrings cannot read fails.
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
# Two workers (pytest-xdist): most tests wait on subprocesses, so two halve the wall time on
# two cores; `bash scripts/test.sh -n 0` runs the suite in one process.
exec .venv/bin/python -m pytest -q -n 2 --durations=25 "$@"
