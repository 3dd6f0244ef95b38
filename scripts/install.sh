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
# Azurite, the Azure Blob emulator the Azure store's tests run against, pinned, into
# .venv/azurite (npm's own folder, nothing global). Without npm those tests skip and say why.
AZURITE_VERSION=3.37.0
if [ -x .venv/azurite/node_modules/.bin/azurite-blob ] \
    && grep -q "\"version\": \"$AZURITE_VERSION\"" .venv/azurite/node_modules/azurite/package.json 2>/dev/null; then
    :
elif command -v npm >/dev/null 2>&1; then
    npm install --prefix .venv/azurite --no-audit --no-fund --silent "azurite@$AZURITE_VERSION"
else
    echo "install.sh: npm not found: Azurite not installed, the Azure store tests will skip (install Node.js and npm, then run this again)" >&2
fi
