#!/usr/bin/env bash
# tiled_cuda.sh — TiledMLP on a CUDA GPU through sample_host --device cuda and the
# plugin on the cuda backend (tests/gpu/run.sh runs it; make test does not).
#  (a) tiles = 3 over B*T = 8*64 = 512 tokens (tiles of 171 rows: the last is
#      shorter and one straddles a sequence boundary) vs the same run untiled,
#      everything resident: per-step losses within 1e-6 relative over 20 steps
#      (the tiles' weight gradients are summed in one fp32 accumulator and added
#      into the gradient once by the backend's convert-accumulate kernel, so only
#      the order of the fp32 sums differs);
#  (b) the same at a 16 MiB device (parameter chunks streamed, CPU Adam) vs that
#      capacity untiled: within 1e-6 as well;
#  the plan must say the MLP ran tiled (its "tiled MLP" line), so an ignored
#  [tiled_mlp] section cannot pass as an equal run, and every step of both runs
#  must have run the pair's plan (metrics mode A with no pinned bytes for (a),
#  B with pinned bytes for (b)).
# Without a GPU or libsample_cuda.so it says so and exits 0.
set -u
ROOT=${PT_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
BUILD=${PT_BUILD:-$ROOT/build}
SH=$BUILD/sample_host
PLUGIN=$BUILD/protrain_plugin.so
cd "$ROOT" || exit 2
. "$ROOT/tests/gpu/lib.sh"
gpu_probe tiled_cuda

MODEL=(--layers 4 --channels 128 --heads 4 --batch 8 --seq 64 --steps 20 --lr 1e-3
       --warmup 5 --max-grad-norm 1.0 --weight-decay 0.01 --val-every 0 --val-batches 2
       --gen-every 0 --metrics-no-time --seed 7 --plugin "$PLUGIN" --device cuda)

ini() { # ini NAME CAPACITY TILES(0 = untiled)
  local f=$tmp/$1.ini
  { echo "[plugin]"; echo "backend = cuda"; echo "log_level = info"
    echo "[memory]"; echo "device_capacity = $2"
    if [ "$3" != 0 ]; then echo "[tiled_mlp]"; echo "enabled = true"; echo "tiles = $3"; fi
  } >"$f"
  echo "$f"
}
run() { # run NAME CONFIG
  if ! "$SH" "${MODEL[@]}" --config "$2" --metrics "$tmp/$1.jsonl" >"$tmp/$1.out" 2>&1; then
    echo "  ($1 failed:)"; sed 's/^/  | /' "$tmp/$1.out" | tail -5; return 1
  fi
}
fail=0
pair() { # pair LABEL CAPACITY PLAN: PLAN the mode both runs must run in
  local t=$1_t u=$1_u
  if ! run "$t" "$(ini "$t" "$2" 3)" || ! run "$u" "$(ini "$u" "$2" 0)"; then
    echo "FAIL $1: a run failed"; fail=1; return
  fi
  if ! grep -q "tiled MLP *3 tiles of 171 tokens" "$tmp/$t.out"; then
    echo "FAIL $1: the tiled run's plan does not say 3 tiles of 171 tokens:"
    grep -i "tiled" "$tmp/$t.out" | head -3 | sed 's/^/  | /'; fail=1; return
  fi
  if ! plan_is "$tmp/$t.jsonl" "$3" || ! plan_is "$tmp/$u.jsonl" "$3"; then
    echo "FAIL $1: the runs did not run mode $3 (the plan this pair is about)"; fail=1; return
  fi
  local d
  d=$(maxrel "$tmp/$t.jsonl" "$tmp/$u.jsonl")
  if python3 -c "import sys; sys.exit(0 if float('$d') <= 1e-6 else 1)"; then
    echo "PASS $1: tiles 3 vs untiled at $2 on cuda (max relative loss difference $d <= 1e-6)"
  else
    echo "FAIL $1: tiles 3 vs untiled at $2 on cuda (max relative loss difference $d > 1e-6)"; fail=1
  fi
}
pair a auto A
pair b 16MiB B
exit $fail
