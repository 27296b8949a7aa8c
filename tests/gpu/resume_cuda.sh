#!/usr/bin/env bash
# resume_cuda.sh — checkpoint generations and --resume with sample_host --device cuda
# (run on a machine with a GPU; make test does not run this folder). For each of
#   --no-plugin (the parameters and AdamW m, v copied through libsample_cuda.so),
#   the plugin resident on cuda, and the plugin with a capacity that forces offload:
# a run stopped after step 7 and resumed must give the uninterrupted run's per-step
# losses bit for bit, every step in the plan the case is about (the metrics' mode:
# A resident with no pinned bytes at 8 GiB, B offloaded at 16 MiB); a generation
# saved on cuda is refused on cpu ("device").
# One PASS/FAIL line each, non-zero exit on a failure; "no GPU: skipped" (exit 0)
# without a GPU or libsample_cuda.so.
set -u
ROOT=${PT_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
BUILD=${PT_BUILD:-$ROOT/build}
SH=$BUILD/sample_host
cd "$ROOT" || exit 2
. "$ROOT/tests/gpu/lib.sh"
if [ ! -x "$SH" ]; then echo "FAIL setup: $SH is not built"; exit 1; fi
if [ ! -e "$BUILD/libsample_cuda.so" ]; then echo "no GPU: skipped (no libsample_cuda.so)"; exit 0; fi
tmp=$(mktemp -d /tmp/resume_cuda.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
if ! "$SH" --no-plugin --device cuda --steps 0 --quiet --layers 1 --channels 32 --heads 2 \
     --batch 1 --seq 8 --val-batches 1 >"$tmp/probe.out" 2>&1; then
  if grep -q "no usable CUDA GPU" "$tmp/probe.out"; then echo "no GPU: skipped"; exit 0; fi
  echo "FAIL probe:"; cat "$tmp/probe.out"; exit 1
fi
MODEL=(--layers 4 --channels 128 --heads 4 --batch 8 --seq 64 --grad-accum 2 --steps 16
       --lr 1e-3 --warmup 5 --max-grad-norm 1.0 --weight-decay 0.01 --val-every 5
       --val-batches 2 --gen-every 0 --quiet --metrics-no-time --seed 7 --device cuda)
ini() {
  { echo "[plugin]"; echo "backend = cuda"; echo "log_level = warn"
    echo "[memory]"; echo "device_capacity = $2"; } >"$tmp/$1.ini"
  echo "--config $tmp/$1.ini"
}
fail=0
losses() { sed 's/,"tok_s".*//' "$1"; }
case_() { # case_ NAME PLAN(A|B|-) args...: PLAN the plugin mode every step must run in
  local n=$1 plan=$2; shift 2
  "$SH" "${MODEL[@]}" "$@" --metrics "$tmp/$n.ref.jsonl" >"$tmp/$n.out" 2>&1 &&
  "$SH" "${MODEL[@]}" "$@" --metrics "$tmp/$n.jsonl" --checkpoint-dir "$tmp/$n.ck" \
     --checkpoint-every 3 --stop-after 7 >>"$tmp/$n.out" 2>&1 &&
  "$SH" "${MODEL[@]}" "$@" --metrics "$tmp/$n.jsonl" --checkpoint-dir "$tmp/$n.ck" \
     --checkpoint-every 3 --resume >>"$tmp/$n.out" 2>&1
  local rc=$?
  if [ $rc = 0 ] && [ "$plan" != - ] && ! { plan_is "$tmp/$n.ref.jsonl" "$plan" && plan_is "$tmp/$n.jsonl" "$plan"; }; then
    echo "FAIL $n: the runs did not run the plan the case is about (mode $plan)"; fail=1
  elif [ $rc = 0 ] && [ "$(losses "$tmp/$n.ref.jsonl" | wc -l)" = 16 ] &&
     cmp -s <(losses "$tmp/$n.ref.jsonl") <(losses "$tmp/$n.jsonl"); then
    echo "PASS $n (stop after 7, resume: 16 losses identical)"
  else
    echo "FAIL $n (exit $rc)"; tail -5 "$tmp/$n.out"; fail=1
  fi
}
case_ no-plugin - --no-plugin
case_ plugin-resident A $(ini res 8GiB) --plugin "$BUILD/protrain_plugin.so"
case_ plugin-offload B $(ini off 16MiB) --plugin "$BUILD/protrain_plugin.so"
# a cuda generation on cpu: refused, naming the setting
if "$SH" "${MODEL[@]}" --no-plugin --device cpu --checkpoint-dir "$tmp/no-plugin.ck" --resume \
     >"$tmp/x.out" 2>&1; then
  echo "FAIL cuda generation resumed on cpu"; fail=1
elif grep -q "device = cuda but this run has device = cpu" "$tmp/x.out"; then
  echo "PASS cuda generation refused on cpu"
else
  echo "FAIL cuda generation on cpu: unexpected output"; cat "$tmp/x.out"; fail=1
fi
exit $fail
