#!/usr/bin/env bash
# Set up everything on a fresh clone: a virtual environment in .venv with torch, then
# shardstream (editable) with its test extra (pytest, the SeaweedFS S3 server binary).
#   SHARDSTREAM_TORCH_SPEC  torch requirement to install first (default torch==2.13.0, a CPU
#                           build; GPU users set e.g. "torch==2.13.0" from their CUDA index
#                           or pre-install torch in the venv: an installed torch is kept)
#   SHARDSTREAM_VENV        venv directory (default .venv)
#   SHARDSTREAM_EXTRAS      the extras to install (default test: everything the tests use,
#                           DALI included; tools/demo sets demo: the S3 server only)
#   PYTHON                  interpreter to create it with (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${SHARDSTREAM_VENV:-.venv}
if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
  echo "bootstrap: installing ${SHARDSTREAM_TORCH_SPEC:-torch==2.13.0} into $venv" >&2
  "$venv/bin/python" -m pip install -q "${SHARDSTREAM_TORCH_SPEC:-torch==2.13.0}"
fi
"$venv/bin/python" -m pip install -q -e ".[${SHARDSTREAM_EXTRAS:-test}]" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
"$venv/bin/python" -c "import shardstream, torch, webdataset, aiobotocore" 
