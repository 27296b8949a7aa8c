#!/usr/bin/env bash
# verdict.sh TEST_GPU_LOG PEERS_LOG [RC_TEST_GPU RC_PEERS] — gpu_day.sh's
# verdict. A GPU day is green only when what it came to measure ran: make
# test-gpu finished on a GPU (its summary line present, "nothing ran" absent)
# with at least one pass, no failure and no skip (a skip lists what did not
# run: a missing tool, a cmocka skip), and make
# bench-peers ran its GPU mode (not the CPU rehearsal) and said OK. Each
# reason for red is printed; exit 1 on red.
set -u
t=$1 p=$2 rc_t=${3:-0} rc_p=${4:-0}
red=()
if [ ! -s "$t" ]; then
  red+=("no make test-gpu log ($t)")
elif grep -q "nothing ran, nothing claimed" "$t"; then
  red+=("make test-gpu found no GPU: nothing ran")
else
  line=$(grep -E '^test-gpu: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' "$t" | tail -1)
  if [ -z "$line" ]; then
    red+=("make test-gpu did not finish (no summary line; exit $rc_t)")
  else
    read -r np nf ns <<< "$(echo "$line" | sed -E 's/^test-gpu: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped.*/\1 \2 \3/')"
    [ "$np" -gt 0 ] || red+=("make test-gpu passed no check")
    [ "$nf" = 0 ] || red+=("make test-gpu: $nf check(s) failed")
    if [ "$ns" != 0 ]; then
      red+=("make test-gpu: $ns check(s) did not run, or ran only in part:")
      while IFS= read -r l; do red+=("  $l"); done < <(grep -E '^SKIP  ' "$t")
    fi
  fi
  [ "$rc_t" = 0 ] || red+=("make test-gpu exit $rc_t")
fi
if [ ! -s "$p" ]; then
  red+=("no make bench-peers log ($p)")
else
  if ! grep -q '^bench-peers: GPU:' "$p"; then
    red+=("make bench-peers did not run on the GPU (its CPU rehearsal ran, or it did not start)")
  elif ! grep -q '^bench-peers: OK' "$p"; then
    red+=("make bench-peers did not say OK${rc_p:+ (exit $rc_p)}: $(grep -m1 'FAIL' "$p")")
  fi
  [ "$rc_p" = 0 ] || red+=("make bench-peers exit $rc_p")
fi
na=$( [ -s "$t" ] && grep -E '^N/A   ' "$t" || true)
if [ ${#red[@]} = 0 ]; then
  echo "gpu_day: GREEN: make test-gpu ran every check this machine can run and passed, bench-peers measured on the GPU"
  [ -z "$na" ] || { echo "  not measurable on this machine (more GPUs needed):"; echo "$na" | sed 's/^/  /'; }
  exit 0
fi
echo "gpu_day: RED:"
printf '  %s\n' "${red[@]}"
exit 1
