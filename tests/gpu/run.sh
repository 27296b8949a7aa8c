#!/usr/bin/env bash
# make test-gpu: every CUDA path, on a GPU machine. One line per check with its
# time (PASS/FAIL/SKIP), then `N passed, N failed` (and the skips); without a
# GPU it says so and exits 0 having claimed nothing. Sized for <= 4 minutes on
# one H100.
#   1. every backend op on the cuda backend against the CPU reference
#      (test_backend_ops, with PT_TEST_LARGE=1: kernels past 2^31 elements), then
#      named groups of it on lines of their own: OSFT's dense ops (gemm_f32 on
#      cuBLAS, cols_f32, svd_f32 on cuSOLVER) against a double reference;
#      REKLS's eigh (cuSOLVER) and element kernel against the host backend's
#      functions; the gradient add of TiledMLP (convert with accumulate, fp32
#      into fp32) bit-identical to the CPU sum
#   2. the same under compute-sanitizer memcheck, racecheck and synccheck,
#      where compute-sanitizer is installed
#   3. the device wrapper's tests, which open cuda when a GPU is there
#   4. sample_host on cuda (tests/gpu/sample_cuda.sh), where it is built
#   5. sample_host checkpoint/resume on cuda (tests/gpu/resume_cuda.sh), likewise
#   6. TiledMLP on cuda (tests/gpu/tiled_cuda.sh): tiled vs untiled within 1e-6
#   7. the NCCL transport (tests/gpu/nccl.sh): world 1 and the failure paths on
#      one GPU; 2-3 ranks and data-parallel training with 2+ GPUs
#   8. the bucketed all-reduce on NCCL: reported as not built, not run (NCCL
#      keeps the blocking path; the reason is printed)
#   9. the PyTorch host on cuda: the pytest suite of host_api/python with
#      PT_TEST_DEVICE=cuda, the tests whose names say cuda (-k cuda), where
#      that suite and a Python with torch and pytest exist
set -u
B=${PT_BUILD:-build}
cd "$(dirname "$0")/../.."
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "test-gpu: no GPU on this machine (nvidia-smi finds none): nothing ran, nothing claimed"
  exit 0
fi
if [ ! -f "$B/libprotrain_cuda.so" ]; then
  echo "test-gpu: FAIL: $B/libprotrain_cuda.so is not built (is nvcc installed?)"
  exit 1
fi
nvidia-smi -L
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
export PT_BUILD=$(cd "$B" && pwd) PT_ROOT=$(pwd) LD_LIBRARY_PATH=$(cd "$B" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CMOCKA_MESSAGE_OUTPUT=stdout OMP_WAIT_POLICY=PASSIVE
pass=0; fail=0; skip=0; summary=""; T0=$(date +%s.%N)
secs() { python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$1" "$2"; }
LOG=$(mktemp /tmp/test_gpu.XXXXXX)
trap 'rm -f "$LOG"' EXIT
# A check passes only when everything in it ran: a script that printed its
# no-GPU line is a skip, and so is one that passed its own checks but skipped
# some ("SKIP ..." lines, e.g. nccl.sh's 2-rank checks on a 1-GPU machine, or
# cmocka's "[  SKIPPED ]"),
# with what it skipped in the summary. A check that needs more GPUs than the
# machine has says "N/A" (nccl.sh's 2-rank checks on a 1-GPU machine: NCCL
# wants one GPU per rank): listed as N/A, not a skip, since no machine of that
# kind can run it. A skip is not a failure of make
# test-gpu; gpu_day.sh ends red on any (tests/gpu/verdict.sh).
check() {   # name, command...
  local name=$1; shift
  echo "=== $name"
  local t0 rc; t0=$(date +%s.%N)
  "$@" 2>&1 | tee "$LOG"; rc=${PIPESTATUS[0]}
  local dt; dt=$(secs "$t0" "$(date +%s.%N)")
  local inner; inner=$(grep -cE '^SKIP |^\[  SKIPPED \]' "$LOG")   # scripts', cmocka's
  if [ $rc = 0 ] && grep -q "^no GPU: skipped\|nothing ran, nothing claimed" "$LOG"; then
    skip=$((skip+1)); summary+="SKIP  $name  (${dt} s: $(grep -m1 "no GPU\|nothing ran" "$LOG"))"$'\n'
  elif [ $rc = 0 ] && [ "$inner" -gt 0 ]; then
    skip=$((skip+1))
    summary+="SKIP  $name  (${dt} s: what ran passed; $inner of its checks skipped: $(grep -m1 -E '^SKIP |^\[  SKIPPED \]' "$LOG"))"$'\n'
  elif [ $rc = 0 ]; then pass=$((pass+1)); summary+="PASS  $name  (${dt} s)"$'\n'
    while IFS= read -r l; do summary+="N/A   $name: ${l#N/A  }"$'\n'; done < <(grep -E '^N/A  ' "$LOG")
  else fail=$((fail+1)); summary+="FAIL  $name  (${dt} s, exit $rc)"$'\n'; fi
}
skipped() { skip=$((skip+1)); summary+="SKIP  $1 ($2)"$'\n'; echo "=== $1: skipped: $2"; }
# a feature this build does not have: said on its own line, neither run nor skipped
notbuilt() { summary+="NOT BUILT  $1 ($2)"$'\n'; echo "=== $1: not built: $2"; }
ops() { env PT_TEST_BACKEND=cuda "$@" "$B/tests/test_backend_ops"; }

check "backend ops on cuda (all, incl. > 2^31 elements)" ops PT_TEST_LARGE=1
check "OSFT ops on cuda: gemm (cuBLAS), cols, svd (cuSOLVER) vs reference" ops PT_TEST_FILTER=test_linalg
check "REKLS ops on cuda: eigh (cuSOLVER), element kernel vs host backend" ops PT_TEST_FILTER=test_rekls_ops
check "TiledMLP gradient add on cuda (convert-accumulate) vs CPU sum" ops "PT_TEST_FILTER=test_convert_accumulate*"
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [ -n "$CS" ]; then
  for tool in memcheck racecheck synccheck; do
    check "backend ops on cuda under compute-sanitizer $tool" \
      "$CS" --tool "$tool" --error-exitcode 99 env PT_TEST_BACKEND=cuda "$B/tests/test_backend_ops"
  done
else
  skipped "compute-sanitizer" "not installed"
fi
check "device wrapper (opens cuda)" env PT_TEST_REQUIRE_CUDA=1 "$B/tests/test_gpu_device"
if [ -f "$B/libsample_cuda.so" ]; then
  check "sample_host on cuda" bash tests/gpu/sample_cuda.sh
  check "sample_host checkpoint/resume on cuda" bash tests/gpu/resume_cuda.sh
  check "TiledMLP on cuda: tiled vs untiled within 1e-6" bash tests/gpu/tiled_cuda.sh
else
  for c in "sample_host on cuda" "sample_host checkpoint/resume on cuda" "TiledMLP on cuda"; do
    skipped "$c" "$B/libsample_cuda.so not built"
  done
fi
if [ -f "$B/libprotrain_nccl.so" ]; then
  check "NCCL transport (world 1 and failures on 1 GPU; 2-3 ranks with 2+ GPUs)" bash tests/gpu/nccl.sh
else
  skipped "NCCL transport" "$B/libprotrain_nccl.so not built (nvcc or the toolkit's nccl.h missing)"
fi
notbuilt "bucketed all-reduce on NCCL" "NCCL keeps the blocking path: it matches collectives by \
the order ranks issue them, not by key, and a bucket starts whenever its rank's device reaches it, \
so two ranks could issue buckets in different orders; with NCCL every gradient is all-reduced after \
backward in layout order (runtime/store/dist_grad.c); the blocking path's sums are checked by the \
NCCL transport check above"
# $PT_PY, else build/venv's python, else python3 when it imports torch (the GPU
# machines' python3 does)
PY=${PT_PY:-$B/venv/bin/python}
if [ -z "${PT_PY:-}" ] && [ ! -x "$PY" ] && python3 -c "import torch, pytest" 2>/dev/null; then PY=python3; fi
if [ ! -d host_api/python/tests ]; then
  skipped "PyTorch host on cuda" "host_api/python/tests does not exist"
elif ! "$PY" -c "import torch, pytest" 2>/dev/null; then
  skipped "PyTorch host on cuda" "no Python with torch and pytest ($PY; set PT_PY)"
else
  t0=$(date +%s.%N)
  log=$(mktemp); PT_TEST_DEVICE=cuda "$PY" -m pytest -q -rs -k cuda host_api/python/tests 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  dt=$(secs "$t0" "$(date +%s.%N)")
  # pytest exits 0 when every selected test skipped: on a machine with a GPU
  # that means the oracle did not run (torch sees no device, a missing
  # variable), which must not read as a pass
  ran=$(grep -Eo '[0-9]+ passed' "$log" | tail -1); rm -f "$log"
  if [ $rc = 5 ]; then skipped "PyTorch host on cuda" "no test of host_api/python/tests has cuda in its name"
  elif [ $rc = 0 ] && [ -z "$ran" ]; then
    fail=$((fail+1)); summary+="FAIL  PyTorch host on cuda (pytest -k cuda): every test skipped on a GPU machine  (${dt} s)"$'\n'
  elif [ $rc = 0 ]; then pass=$((pass+1)); summary+="PASS  PyTorch host on cuda (pytest -k cuda, $ran)  (${dt} s)"$'\n'
  else fail=$((fail+1)); summary+="FAIL  PyTorch host on cuda (pytest -k cuda)  (${dt} s, exit $rc)"$'\n'; fi
fi
echo "=== test-gpu summary"
printf "%s" "$summary"
echo "test-gpu: $pass passed, $fail failed, $skip skipped in $(secs "$T0" "$(date +%s.%N)") s"
[ "$fail" = 0 ]
