#!/usr/bin/env bash
# make bench-gpu: sample_host on a CUDA GPU, with and without the plugin, on a
# GPT-2-small-shaped model (12 blocks, 768 channels, 12 heads, byte vocabulary,
# 85M parameters, batch 8 x 256, fp32, no clipping), 30 steps per run, median
# tok/s of steps 6-30, REPEATS alternating rounds (default 3):
#   no-plugin | plugin, capacity auto | plugin, 1 GiB | plugin, 600 MiB
# Prints each run, the median ratio to --no-plugin per configuration, and
# checks that every run of a round ends at the same loss bit for bit.
# PT_BENCH_STRICT=1: exit non-zero when the auto-capacity plugin run is below
# 0.98x of --no-plugin or a loss differs. Without a GPU: says so, exits 0.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${PT_BUILD:-$ROOT/build}
REPEATS=${REPEATS:-3}
cd "$ROOT" || exit 2
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "bench-gpu: no GPU on this machine (nvidia-smi finds none): nothing measured"; exit 0
fi
if [ ! -f "$B/libsample_cuda.so" ]; then echo "bench-gpu: $B/libsample_cuda.so is not built"; exit 1; fi
command -v python3 >/dev/null || { echo "bench-gpu: needs python3 to read the metrics"; exit 1; }
T=$(mktemp -d /tmp/bench_cuda.XXXXXX); trap 'rm -rf "$T"' EXIT
M=(--device cuda --layers 12 --channels 768 --heads 12 --batch 8 --seq 256 --steps 30
   --val-every 0 --gen-every 0 --quiet --max-grad-norm 0 --warmup 5 --val-batches 1)
CAPS=(auto 1GiB 600MiB)
for c in "${CAPS[@]}"; do
  printf "[plugin]\nbackend = cuda\nlog_level = warn\n[memory]\ndevice_capacity = %s\n" "$c" > "$T/$c.ini"
done
for r in $(seq 1 "$REPEATS"); do
  "$B/sample_host" "${M[@]}" --no-plugin --metrics "$T/none.$r.jsonl" > "$T/none.$r.log" 2>&1 \
    || { echo "no-plugin run failed:"; tail -3 "$T/none.$r.log"; exit 1; }
  for c in "${CAPS[@]}"; do
    "$B/sample_host" "${M[@]}" --config "$T/$c.ini" --plugin "$B/protrain_plugin.so" \
      --metrics "$T/$c.$r.jsonl" > "$T/$c.$r.log" 2>&1 \
      || { echo "plugin run ($c) failed:"; tail -3 "$T/$c.$r.log"; exit 1; }
  done
done
python3 - "$T" "$REPEATS" "${PT_BENCH_STRICT:-0}" "${CAPS[@]}" <<'PY'
import json, statistics, sys
d, reps, strict, caps = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4:]
def load(name, r):
    rows = [json.loads(l) for l in open("%s/%s.%d.jsonl" % (d, name, r))]
    tok = [x["tok_s"] for x in rows if x.get("tok_s")][5:]
    return statistics.median(tok), [x["loss"] for x in rows if "loss" in x]
ok = True
med = {}
for name in ["none"] + caps:
    runs = [load(name, r) for r in range(1, reps + 1)]
    med[name] = statistics.median(t for t, _ in runs)
    print("%-22s %s tok/s (median %.0f)" % ("no-plugin" if name == "none" else "plugin, " + name,
          " / ".join("%.0f" % t for t, _ in runs), med[name]))
for r in range(1, reps + 1):
    ref = load("none", r)[1]
    for c in caps:
        if load(c, r)[1] != ref:
            ok = False
            print("round %d: plugin (%s) losses differ from --no-plugin" % (r, c))
for c in caps:
    print("ratio plugin %-8s / no-plugin = %.3f" % (c, med[c] / med["none"]))
goal = med["auto"] / med["none"] >= 0.98
print("goal: plugin with auto capacity >= 0.98x of --no-plugin: %s" % ("met" if goal else "MISSED"))
print("losses: %s" % ("bit-identical in every round" if ok else "DIFFER"))
sys.exit(1 if strict and not (goal and ok) else 0)
PY
