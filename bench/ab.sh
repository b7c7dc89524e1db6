#!/usr/bin/env bash
# A/B of one benchmark between two source trees of shardstream, run alternately (A B A B ...)
# so drift on a noisy machine falls on both alike. Each tree's package is put first on
# PYTHONPATH; the venv is the same. Output goes to $OUT_DIR/{a,b}-N.log.
#   bench/ab.sh OLD_TREE NEW_TREE ROUNDS -- python bench/collate.py --rounds 5
# e.g. OLD_TREE from `git archive 8ac859e | tar -x -C /tmp/old`.
set -euo pipefail
old=$(realpath "$1"); new=$(realpath "$2"); rounds=$3; shift 4
out=${OUT_DIR:-$(mktemp -d)}
mkdir -p "$out"
for ((i = 1; i <= rounds; i++)); do
  for side in a b; do
    tree=$old; [ "$side" = b ] && tree=$new
    echo "ab: round $i, $side ($tree): $*" >&2
    rc=0
    (cd "$tree" && PYTHONPATH="$tree" "$@") >"$out/$side-$i.log" 2>&1 || rc=$?
    [ "$rc" = 0 ] || echo "ab: round $i, $side exited $rc (see $out/$side-$i.log)" >&2
  done
done
echo "$out"
