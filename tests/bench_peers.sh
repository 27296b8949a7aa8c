#!/usr/bin/env bash
# bench_peers.sh — make test's run of make bench-peers's CPU rehearsal
# (tests/bench/peers/bench_peers.py --cpu: a tiny Llama under plain PyTorch and
# protrain through the PyTorch host, the GPU peers reported as skipped), so the
# benchmark's code cannot rot between GPU days. It fails when plain PyTorch
# does not train, when any system fails, or when protrain's losses leave plain
# PyTorch's (the script's rehearsal check). Needs the Python environment at
# $PT_BUILD/venv (torch, transformers), which the PyTorch host's make target
# creates; without it the rehearsal fails (it did not run).
set -u
ROOT=${PT_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
B=${PT_BUILD:-$ROOT/build}
if [ -n "${PT_SAN:-}" ]; then
    # The interpreter is not instrumented: a sanitizer build of the plugin does
    # not load into it (the runtime must come first), so Python hosts run only
    # in the plain build.
    echo "bench-peers rehearsal: skipped under SAN=$PT_SAN"; exit 0
fi
PY=$ROOT/build/venv/bin/python
if [ ! -x "$PY" ]; then
  # make test needs the environment for its pytest run too: missing, nothing
  # here ran, which must not read as a pass
  echo "FAIL bench-peers rehearsal: $PY missing, nothing ran (build/venv is created by the PyTorch host's make target)"
  exit 1
fi
out=$(mktemp -d /tmp/bench_peers.XXXXXX)
trap 'rm -rf "$out"' EXIT
PT_BUILD=$B PYTHONUNBUFFERED=1 timeout 150 "$PY" "$ROOT/tests/bench/peers/bench_peers.py" --cpu \
  --out "$out" --budget 100
rc=$?
for f in peers.json peers.md; do
  if [ ! -s "$out/$f" ]; then echo "FAIL bench-peers rehearsal: $f not written"; rc=1; fi
done
exit $rc
