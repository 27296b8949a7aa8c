#!/usr/bin/env bash
# gpu_day.sh [OUT] — what a GPU slot runs, in this order, sized for one
# 10-minute command: build (make all), make test-gpu (<= TEST_GPU_S), then
# make bench-peers with a budget of PEERS_BUDGET seconds (killed at PEERS_S).
# Logs and the bench table land in OUT ($OUT when set, else build/gpu_day):
# gpu.txt, build.log, test_gpu.log, peers.log, peers.json, peers.md,
# verdict.txt (flat, so a device runner that returns a folder's files gets them
# all). The day ends red (exit 1) unless everything it came to measure ran and
# passed (tests/gpu/verdict.sh): no GPU, a failed or skipped check of make
# test-gpu, or a bench-peers that did not measure on the GPU is red.
# GPU machines fetch nothing, so two things travel with the tree, made
# beforehand on a machine with network: the DeepSpeed wheels (make peers-wheels,
# build/wheels) and the build's Debian packages as .deb files (make gpu-debs,
# build/debs, ~20 MB). Where dpkg says a package of the build is not installed,
# the .deb files are unpacked into build/debroot (tests/gpu/debroot.sh, never
# into /) and every make runs with PT_DEBROOT=build/debroot. The call:
#   run(command="bash tests/gpu/gpu_day.sh $OUT", carry=["build/debs","build/wheels"], timeout_s=600)
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 2
O=${1:-${OUT:-build/gpu_day}}
mkdir -p "$O"
# a GPU day on a machine whose nvidia-smi is missing or finds no GPU measures
# nothing: red at once (make test-gpu would say "no GPU" and exit 0)
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L > "$O/gpu.txt" 2>&1 ||
   ! grep -q '^GPU ' "$O/gpu.txt"; then
  echo "gpu_day: RED: nvidia-smi is missing or finds no GPU: nothing to measure"
  cat "$O/gpu.txt" 2>/dev/null
  exit 1
fi
TEST_GPU_S=${TEST_GPU_S:-240}
PEERS_BUDGET=${PEERS_BUDGET:-250}
PEERS_S=${PEERS_S:-$((PEERS_BUDGET + 40))}
export PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  ls build/wheels 2>/dev/null; } > "$O/gpu.txt" 2>&1
missing=$(make -s --no-print-directory missing-debs | tr '\n' ' ')
if [ -z "$missing" ]; then
  echo "packages: installed" >> "$O/gpu.txt"
elif compgen -G "build/debs/*.deb" > /dev/null; then
  echo "packages: not installed here: $missing-> from build/debs" >> "$O/gpu.txt"
  bash tests/gpu/debroot.sh build/debs build/debroot >> "$O/gpu.txt" 2>&1 || { cat "$O/gpu.txt"; exit 1; }
  export PT_DEBROOT=build/debroot
else
  echo "packages: not installed here: $missing and no build/debs (make gpu-debs)" >> "$O/gpu.txt"
fi
cat "$O/gpu.txt"
t0=$(date +%s)
if ! make -j8 all > "$O/build.log" 2>&1; then
  echo "gpu_day: make all failed:"; tail -30 "$O/build.log"; exit 1
fi
echo "gpu_day: built in $(( $(date +%s) - t0 )) s"
timeout "$TEST_GPU_S" make test-gpu 2>&1 | tee "$O/test_gpu.log"
rc_t=$?
timeout "$PEERS_S" make bench-peers PEERS_BUDGET="$PEERS_BUDGET" 2>&1 | tee "$O/peers.log"
rc_p=$?
cp build/peers/peers.json build/peers/peers.md "$O/" 2>/dev/null
echo "gpu_day: test-gpu exit $rc_t, bench-peers exit $rc_p, $(( $(date +%s) - t0 )) s after the build started"
bash tests/gpu/verdict.sh "$O/test_gpu.log" "$O/peers.log" "$rc_t" "$rc_p" | tee "$O/verdict.txt"
exit "${PIPESTATUS[0]}"
