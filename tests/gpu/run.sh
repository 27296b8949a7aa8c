#!/usr/bin/env bash
# make test-gpu: the suite a GPU machine runs. Each check prints PASS/FAIL/SKIP
# and the summary says what ran; without a GPU it says so and exits 0 having
# claimed nothing.
#   1. every backend op on the cuda backend against the CPU reference
#      (test_backend_ops, with PT_TEST_LARGE=1: kernels past 2^31 elements)
#   2. the same under compute-sanitizer memcheck, racecheck and synccheck,
#      where compute-sanitizer is installed
#   3. the device wrapper's tests, which open cuda when a GPU is there
#   4. sample_host on cuda (tests/gpu/sample_cuda.sh), where it is built
#   5. sample_host checkpoint/resume on cuda (tests/gpu/resume_cuda.sh), likewise
#   6. the NCCL transport (tests/gpu/nccl.sh): world 1 and the failure paths on
#      one GPU; 2-3 ranks and data-parallel training with 2+ GPUs
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
export PT_BUILD=$(cd "$B" && pwd) PT_ROOT=$(pwd) LD_LIBRARY_PATH=$(cd "$B" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CMOCKA_MESSAGE_OUTPUT=stdout OMP_WAIT_POLICY=PASSIVE
pass=0; fail=0; skip=0; summary=""
check() {   # name, command...
  local name=$1; shift
  echo "=== $name"
  if "$@"; then pass=$((pass+1)); summary+="PASS  $name"$'\n'
  else fail=$((fail+1)); summary+="FAIL  $name"$'\n'; fi
}
skipped() { skip=$((skip+1)); summary+="SKIP  $1 ($2)"$'\n'; echo "=== $1: skipped: $2"; }

check "backend ops on cuda (incl. > 2^31 elements)" env PT_TEST_BACKEND=cuda PT_TEST_LARGE=1 "$B/tests/test_backend_ops"
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [ -n "$CS" ]; then
  for tool in memcheck racecheck synccheck; do
    check "backend ops on cuda under compute-sanitizer $tool" \
      "$CS" --tool "$tool" --error-exitcode 99 env PT_TEST_BACKEND=cuda "$B/tests/test_backend_ops"
  done
else
  skipped "compute-sanitizer" "not installed"
fi
check "device wrapper (opens cuda)" "$B/tests/test_gpu_device"
if [ -f "$B/libsample_cuda.so" ] && [ -x tests/gpu/sample_cuda.sh ]; then
  check "sample_host on cuda" bash tests/gpu/sample_cuda.sh
else
  skipped "sample_host on cuda" "$B/libsample_cuda.so or tests/gpu/sample_cuda.sh missing"
fi
if [ -f "$B/libsample_cuda.so" ] && [ -x tests/gpu/resume_cuda.sh ]; then
  check "sample_host checkpoint/resume on cuda" bash tests/gpu/resume_cuda.sh
fi
if [ -f "$B/libprotrain_nccl.so" ]; then
  check "NCCL transport (world 1 and failures on 1 GPU; 2-3 ranks with 2+ GPUs)" bash tests/gpu/nccl.sh
else
  skipped "NCCL transport" "$B/libprotrain_nccl.so not built (nvcc or the toolkit's nccl.h missing)"
fi
echo "=== test-gpu summary"
printf "%s" "$summary"
echo "test-gpu: $pass passed, $fail failed, $skip skipped"
[ "$fail" = 0 ]
