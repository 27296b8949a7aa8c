# lib.sh — shared by the tests/gpu/ scripts that drive sample_host on cuda
# (sourced, not run). After `set -u` and with ROOT, BUILD and SH set:
#   gpu_probe NAME   makes $tmp (removed at exit) and checks that sample_host
#                    can open the device at all; without a GPU (or without
#                    libsample_cuda.so) it prints "no GPU: skipped" and exits 0,
#                    when sample_host does not start otherwise it fails (exit 1)
#   maxrel A B       the largest relative difference of the "loss" fields of two
#                    metrics files (JSON lines), or inf when their counts differ
#   plan_is FILE M   0 when every line of metrics FILE ran in the plugin's mode M:
#                    A (all resident, no pinned bytes) or B (offloaded: pinned
#                    bytes in use); else prints what ran and returns 1
gpu_probe() {
  if [ ! -x "$SH" ]; then echo "FAIL setup: $SH is not built"; exit 1; fi
  if [ ! -e "$BUILD/libsample_cuda.so" ]; then
    echo "no GPU: skipped (no libsample_cuda.so: nvcc absent at build time)"; exit 0
  fi
  tmp=$(mktemp -d "/tmp/$1.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  if ! "$SH" --no-plugin --device cuda --steps 0 --quiet --layers 1 --channels 32 --heads 2 \
       --batch 1 --seq 8 --val-batches 1 >"$tmp/probe.out" 2>&1; then
    if grep -q "no usable CUDA GPU" "$tmp/probe.out"; then echo "no GPU: skipped"; exit 0; fi
    echo "FAIL probe: sample_host --device cuda did not start:"; cat "$tmp/probe.out"; exit 1
  fi
}
maxrel() {
  python3 - "$1" "$2" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
if len(a) != len(b) or not a:
    print("inf"); sys.exit()
print("%.3e" % max(abs(x - y) / max(abs(y), 1e-30) for x, y in zip(a, b)))
PY
}
plan_is() {
  python3 - "$1" "$2" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
want = sys.argv[2]
ok = bool(rows) and all(r.get("mode") == want and
                        ((r.get("pinned_bytes") or 0) > 0) == (want == "B") for r in rows)
if not ok:
    print("  plan: want mode %s, ran %s" % (want, sorted({(r.get("mode"), r.get("pinned_bytes"))
                                                           for r in rows})[:3]))
sys.exit(0 if ok else 1)
PY
}
