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
#   SHARDSTREAM_INSTALLER   uv (default: installed into the venv with pip, then it installs the
#                           rest) or pip
# With the test extra it also installs the servers the tests start that are not Python
# packages: nginx (Debian package nginx-light, via apt-get as root) for the http(s) stores, and
# Azurite 3.35.0 (npm, into .cache/azurite; the last release that runs on Node 20) for az://.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${SHARDSTREAM_VENV:-.venv}
if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
# uv installs the same packages as pip, about 10x faster (~10 s instead of ~80 s here); it reads
# no pip.conf, so pip's find-links (where this machine keeps its torch wheels) are handed to it.
# Unlike pip it compiles no bytecode ahead (--compile-bytecode: ~30 s here for all of torch, Ray,
# DALI, transformers...): tools/test lets Python write it as modules are first imported.
if [ "${SHARDSTREAM_INSTALLER:-uv}" = uv ] && [ ! -x "$venv/bin/uv" ]; then
  "$venv/bin/python" -m pip install -q uv 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2) ||
    echo "bootstrap: uv could not be installed; installing with pip" >&2
fi
install() {
  if [ "${SHARDSTREAM_INSTALLER:-uv}" = uv ] && [ -x "$venv/bin/uv" ]; then
    local links=() link
    for link in ${PIP_FIND_LINKS:-} $("$venv/bin/python" -m pip config get global.find-links 2>/dev/null || true); do
      links+=(--find-links "$link")
    done
    "$venv/bin/uv" pip install --quiet --python "$venv/bin/python" ${links[@]+"${links[@]}"} "$@"
  else
    "$venv/bin/python" -m pip install -q "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  fi
}
if ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
  echo "bootstrap: installing ${SHARDSTREAM_TORCH_SPEC:-torch==2.13.0} into $venv" >&2
  install "${SHARDSTREAM_TORCH_SPEC:-torch==2.13.0}"
fi
install -e ".[${SHARDSTREAM_EXTRAS:-test}]"
"$venv/bin/python" -c "import shardstream, torch, webdataset, aiobotocore" 
if [ "${SHARDSTREAM_EXTRAS:-test}" = test ]; then
  if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "bootstrap: installing nginx-light (apt-get) for the http(s) store tests" >&2
      apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >&2
    else
      echo "bootstrap: the tests need nginx: install it (apt-get install nginx-light) and run again" >&2
      exit 1
    fi
  fi
  if [ ! -x .cache/azurite/node_modules/.bin/azurite-blob ]; then
    if ! command -v npm >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >&2
    fi
    echo "bootstrap: installing Azurite 3.35.0 (npm) into .cache/azurite for the az:// store tests" >&2
    npm install --prefix .cache/azurite --no-audit --no-fund --loglevel=error azurite@3.35.0 >&2
  fi
fi
