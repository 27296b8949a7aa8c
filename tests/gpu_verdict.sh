#!/usr/bin/env bash
# The GPU day's verdict (tests/gpu/verdict.sh) on hand-made logs: green only
# when make test-gpu ran every check the machine can run and bench-peers
# measured on the GPU. Runs on CPU in make test so the verdict cannot rot
# between GPU days.
set -u
V=$(dirname "$0")/gpu/verdict.sh
d=$(mktemp -d /tmp/gpu_verdict.XXXXXX); trap 'rm -rf "$d"' EXIT
fail=0
expect() {  # want(0|1) name test_log peers_log [rc_t rc_p]
  local want=$1 name=$2; shift 2
  bash "$V" "$@" > "$d/out" 2>&1; local rc=$?
  if [ "$rc" = "$want" ]; then echo "PASS $name"; else echo "FAIL $name (exit $rc, wanted $want)"; sed 's/^/  | /' "$d/out"; fail=1; fi
}
printf 'PASS  ops  (1 s)\ntest-gpu: 7 passed, 0 failed, 0 skipped\n' > "$d/t_ok"
printf 'bench-peers: GPU: H100\nbench-peers: OK\n' > "$d/p_ok"
printf 'bench-peers: CPU rehearsal\nbench-peers: OK\n' > "$d/p_cpu"
printf 'SKIP  nccl  (what ran passed; 1 of its checks skipped)\ntest-gpu: 6 passed, 0 failed, 1 skipped\n' > "$d/t_skip"
printf 'PASS  nccl  (3 s)\nN/A   nccl: 2-rank NCCL checks (this machine has 1 GPU)\ntest-gpu: 7 passed, 0 failed, 0 skipped\n' > "$d/t_na"
printf 'test-gpu: 0 passed, 0 failed, 0 skipped\n' > "$d/t_none"
printf 'no GPU: nothing ran, nothing claimed\n' > "$d/t_nogpu"
printf 'PASS  ops  (1 s)\n' > "$d/t_cut"
expect 0 "every check ran and passed, peers on the GPU" "$d/t_ok" "$d/p_ok"
expect 0 "a 1-GPU machine's 2-rank checks are N/A, not red" "$d/t_na" "$d/p_ok"
grep -q "not measurable on this machine" "$d/out" || { echo "FAIL N/A lines not listed"; fail=1; }
expect 1 "a skipped check is red" "$d/t_skip" "$d/p_ok"
expect 1 "nothing passed is red" "$d/t_none" "$d/p_ok"
expect 1 "no GPU is red" "$d/t_nogpu" "$d/p_ok"
expect 1 "a cut-off test-gpu log is red" "$d/t_cut" "$d/p_ok"
expect 1 "bench-peers' CPU rehearsal is red" "$d/t_ok" "$d/p_cpu"
expect 1 "a missing peers log is red" "$d/t_ok" "$d/missing"
expect 1 "a non-zero make test-gpu exit is red" "$d/t_ok" "$d/p_ok" 2 0
exit $fail
