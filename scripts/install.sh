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
