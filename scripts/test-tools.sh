#!/usr/bin/env bash
# The tools outside Python the test suite uses, for scripts/test.sh and .ci/run alike: headless
# Chromium for the report's browser test (tests/test_report.py skips without it). Test setup
# only, never part of a user's install: installed where apt-get can run as root (CI
# containers); elsewhere, or when it cannot be installed, it says so and that one test skips.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
        || echo "note: could not install chromium; the report's browser test will skip" >&2
else
    echo "note: chromium not found and apt-get cannot run as root here; the report's browser test will skip" >&2
fi
