#!/usr/bin/env bash
# Installs skygreen and everything its tests need into ./.venv (idempotent).
# torch comes first and pinned: a bare `torch` requirement would pull a multi-GB CUDA build,
# while torch==2.13.0 is the CPU build these machines keep on disk.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q "torch==${SKYGREEN_TORCH_VERSION:-2.13.0}"
.venv/bin/python -m pip install -q -e '.[runtime,tasks,test,report,hf,lightning,docs]'
# Headless Chromium for the report's browser test (tests/test_report.py skips without it).
# Installed where apt-get can run as root (CI containers); elsewhere install it yourself.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ] \
    && [ "${SKYGREEN_NO_CHROMIUM:-0}" != 1 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
        || echo "note: could not install chromium; the report's browser test will skip" >&2
fi
