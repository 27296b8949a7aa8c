#!/usr/bin/env bash
# The disk tier ([nvme], runtime/store/tier/). A model whose offloaded chunks
# need 5368320 pinned bytes (sample_host L=3 C=96, 160 KiB chunks, n_persist 0)
# under [memory] pinned_budget = 4MiB:
#  - without [nvme] path it is refused at post_model_load (the budget is a cap);
#  - with it, it trains: losses bit-identical to --no-plugin, without and with
#    clipping (--max-grad-norm: the CPU steps are deferred into the next
#    forward), the tier file exists while it trains and is gone after, and the
#    pinned peak (the metrics' pinned_peak, pt_stats_v1 ABI 1.7; the tier's log
#    line says the same) stays within the budget, while the same model without
#    the tier at 64 MiB is flagged by that check (control); searched
#    (profile, a plan saying "disk tier", rebuilds carrying the state) too;
#  - negative controls ([testing] debug_skip_ordering): the tier's read before a
#    step skipped (16384), or its write-back after one dropped (32768), and the
#    losses differ from --no-plugin;
#  - resume: a run stopped after step 2 with a checkpoint generation and resumed
#    (a fresh tier, refilled from the state file) matches the --no-plugin run;
#  - refusals with a sentence, exit 1, no crash: a second run on a locked folder
#    (names the holder's pid), a missing path, a path that is a file, a file-size
#    limit that the tier's file exceeds (EFBIG when it is reserved), a write-back
#    failing with ENOSPC during training ([testing] debug_tier_fail_write: the
#    next hook fails with the sentence);
#  - two ranks in mode B (mpirun): bit-identical to the same ranks without the
#    tier, within 1e-6 of one rank with two micro-batches.
set -u
root="${PT_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}"
build="${PT_BUILD:-$root/build}"
sh="$build/sample_host"; plug="$build/protrain_plugin.so"
export PROTRAIN_TESTING=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
tmp=$(mktemp -d /tmp/test_nvme.XXXXXX)
trap '[ -n "${PT_KEEP:-}" ] || rm -rf "$tmp"' EXIT
fail=0; pass=0
bad() { echo "nvme: FAIL: $*"; fail=1; }
ok() { pass=$((pass + 1)); }
model=(--channels 96 --layers 3 --batch 2 --seq 64 --steps 4 --metrics-no-time
       --progress off --gen-every 0)
tier="$tmp/tier"; mkdir -p "$tier"
timed=(); for a in "${model[@]}"; do [ "$a" = --metrics-no-time ] || timed+=("$a"); done
ini() {   # ini FILE [nvme-path] [extra lines...]
    local f=$1 p=${2:-}; shift 2 2>/dev/null || shift $#
    { printf '[memory]\npinned_budget = %s\n[protrain]\nchunk_size = 160KiB\n' "${budget:-4MiB}"
      printf 'auto_memory = false\nn_persist = 0\nn_buffer = 8\nn_swap = 0\nn_checkpoint = 0\n'
      printf 'auto_mode = false\nzero3_shard = off\n'
      [ -n "$p" ] && printf '[nvme]\npath = %s\n' "$p"
      for l in "$@"; do printf '%s\n' "$l"; done; } > "$f"
}
. "$root/tests/lib/tier_lib.sh"
jf() { sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" "$1"; }
# peak_within METRICS BUDGET: every line's pinned_peak a number, the last one in (0, BUDGET]
peak_within() {
    local p; p=$(jf "$1" pinned_peak | tail -1)
    if [ "$(jf "$1" pinned_peak | grep -vc '^[0-9][0-9]*$')" != 0 ] || [ -z "$p" ]; then
        why="pinned_peak missing from $1 ($(tail -1 "$1"))"; return 1; fi
    if [ "$p" -le 0 ] || [ "$p" -gt "$2" ]; then why="pinned peak $p bytes, budget $2"; return 1; fi
}

"$sh" --no-plugin "${model[@]}" --metrics "$tmp/ref.jsonl" > /dev/null 2>&1 || bad "--no-plugin run failed"
"$sh" --no-plugin "${model[@]}" --max-grad-norm 0.05 --metrics "$tmp/refc.jsonl" > /dev/null 2>&1 ||
    bad "--no-plugin run with clipping failed"
[ "$(losses "$tmp/ref.jsonl" | wc -l)" = 4 ] || bad "the reference has no 4 losses"

# 1. the budget is a cap: without the tier the run is refused
ini "$tmp/notier.ini" ""
if "$sh" --config "$tmp/notier.ini" --plugin "$plug" "${model[@]}" > "$tmp/notier.out" 2>&1; then
    bad "a 4 MiB pinned budget without [nvme] path trained (the chunks need more)"
elif grep -q "pinned host memory: the offloaded chunks need" "$tmp/notier.out"; then ok
else bad "no pinned-budget sentence: $(tail -2 "$tmp/notier.out")"; fi

# 2. with the tier: bit-identical, files while it trains, none after, pinned peak in budget
ini "$tmp/tier.ini" "$tier" "[testing]" "debug_cpu_step_delay = 0.02"
"$sh" --config "$tmp/tier.ini" --plugin "$plug" "${model[@]}" --max-grad-norm 0.05 \
    --metrics "$tmp/tier.jsonl" > "$tmp/tier.out" 2>&1 &
pid=$!
seen=0
for _ in $(seq 1 400); do
    [ -f "$tier/protrain-tier.rank0.bin" ] && [ -f "$tier/protrain-tier.rank0.lock" ] && { seen=1; break; }
    kill -0 $pid 2>/dev/null || break
    sleep 0.01
done
wait $pid; rc=$?
if [ $rc -ne 0 ]; then bad "the tiered run with clipping failed ($rc): $(tail -3 "$tmp/tier.out")"
elif [ "$(losses "$tmp/tier.jsonl")" != "$(losses "$tmp/refc.jsonl")" ]; then
    bad "tiered losses with clipping differ from --no-plugin"; paste <(losses "$tmp/tier.jsonl") <(losses "$tmp/refc.jsonl")
else ok; fi
[ $seen = 1 ] && ok || bad "no tier file appeared under the folder while the run trained"
[ -z "$(ls -A "$tier")" ] && ok || bad "the tier's files were left behind: $(ls -A "$tier")"
grep -q "nvme tier: .* chunk(s)' optimizer states" "$tmp/tier.out" && ok || bad "the tier did not open"
# the pinned peak from the metrics (pt_stats_v1.pinned_peak, ABI 1.7) within the budget,
# and the same figure the tier logs at the end
peak=$(sed -n 's/.*pinned peak \([0-9]*\) bytes (budget \([0-9]*\)).*/\1 \2/p' "$tmp/tier.out" | tail -1)
if peak_within "$tmp/tier.jsonl" 4194304; then ok; else bad "tiered run: $why"; fi
if [ -z "$peak" ] || [ "${peak#* }" != 4194304 ]; then bad "no pinned peak logged against the 4 MiB budget"
elif [ "${peak% *}" != "$(jf "$tmp/tier.jsonl" pinned_peak | tail -1)" ]; then
    bad "the logged pinned peak ${peak% *} is not the metrics' $(jf "$tmp/tier.jsonl" pinned_peak | tail -1)"
else ok; fi
# control: the same model without the tier at 64 MiB pins its full states, and the
# check flags that peak against 4 MiB (the metric tracks the allocations)
budget=64MiB ini "$tmp/pin.ini" ""
"$sh" --config "$tmp/pin.ini" --plugin "$plug" "${timed[@]}" --metrics "$tmp/pin.jsonl" > "$tmp/pin.out" 2>&1 ||
    bad "the run without the tier at 64 MiB failed: $(tail -2 "$tmp/pin.out")"
[ "$(jf "$tmp/pin.jsonl" tier_io_s | tail -1)" = 0.000000 ] && ok ||
    bad "the run without the tier reports tier I/O: $(tail -1 "$tmp/pin.jsonl")"
if peak_within "$tmp/pin.jsonl" 4194304; then bad "control: a run pinning its full states passes the 4 MiB peak check"
elif [ "$(jf "$tmp/pin.jsonl" pinned_peak | tail -1)" -ge 5368320 ] 2>/dev/null; then ok
else bad "control: $why (want a peak of at least the chunks' 5368320 bytes)"; fi
reads=$(sed -n 's/.*nvme tier: \([0-9]*\) read(s).*/\1/p' "$tmp/tier.out" | tail -1)
[ "${reads:-0}" -ge 36 ] && ok || bad "the tier read ${reads:-no} records (9 chunks x 4 steps expected)"

# without clipping: the steps overlap backward
ini "$tmp/tier2.ini" "$tier"
if "$sh" --config "$tmp/tier2.ini" --plugin "$plug" "${timed[@]}" --metrics "$tmp/t2.jsonl" \
    > "$tmp/t2.out" 2>&1 && [ "$(losses "$tmp/t2.jsonl")" = "$(losses "$tmp/ref.jsonl")" ]; then ok
else bad "tiered losses without clipping differ from --no-plugin (or the run failed)"; fi
# the tier's counters reach the metrics (timed, so without --metrics-no-time): I/O
# seconds > 0 here (0 in the run without the tier above)
if awk -v io="$(jf "$tmp/t2.jsonl" tier_io_s | tail -1)" -v w="$(jf "$tmp/t2.jsonl" tier_wait_s | tail -1)" \
    'BEGIN { exit !(io + 0 > 0 && w ~ /^[0-9.]+$/) }'; then ok
else bad "tiered run: metrics tier_io_s / tier_wait_s: $(tail -1 "$tmp/t2.jsonl")"; fi

# searched (n_persist fixed at 0, so the plan cannot avoid the tier by keeping
# chunks resident, which it prefers now that its I/O costs time): profile, a plan
# that puts the states on the tier, rebuilds carrying the
# state through it (calibration may re-plan), still bit-identical
printf '[memory]\npinned_budget = 4MiB\ndevice_capacity = 6MiB\n[protrain]\nchunk_size = 160KiB\nn_persist = 0\n[nvme]\npath = %s\n' \
    "$tier" > "$tmp/auto.ini"
if "$sh" --config "$tmp/auto.ini" --plugin "$plug" "${model[@]}" --metrics "$tmp/auto.jsonl" \
    > "$tmp/auto.out" 2>&1 && [ "$(losses "$tmp/auto.jsonl")" = "$(losses "$tmp/ref.jsonl")" ]; then ok
else bad "a searched plan through the tier differs from --no-plugin (or failed): $(tail -1 "$tmp/auto.out")"; fi
grep -q "disk tier  *the offloaded chunks' Adam states" "$tmp/auto.out" && ok || bad "the searched plan does not say 'disk tier'"

# 3. negative controls: read skipped, write-back dropped
for bit in 16384 32768; do
    ini "$tmp/neg.ini" "$tier" "[testing]" "debug_skip_ordering = $bit"
    "$sh" --config "$tmp/neg.ini" --plugin "$plug" "${model[@]}" --metrics "$tmp/neg.jsonl" \
        > "$tmp/neg.out" 2>&1
    if [ "$(losses "$tmp/neg.jsonl")" = "$(losses "$tmp/ref.jsonl")" ]; then
        bad "debug_skip_ordering = $bit (the tier's $([ $bit = 16384 ] && echo read || echo write-back) skipped) still matches --no-plugin"
    else ok; fi
done

# 4. resume refills the tier from the state file
ck="$tmp/ck"
"$sh" --config "$tmp/tier2.ini" --plugin "$plug" "${model[@]}" --checkpoint-dir "$ck" \
    --stop-after 2 --metrics "$tmp/r.jsonl" > "$tmp/r1.out" 2>&1 || bad "the run stopped at 2 failed"
"$sh" --config "$tmp/tier2.ini" --plugin "$plug" "${model[@]}" --checkpoint-dir "$ck" --resume \
    --metrics "$tmp/r.jsonl" > "$tmp/r2.out" 2>&1 || bad "the resumed run failed: $(tail -2 "$tmp/r2.out")"
grep -q "nvme tier: .* chunk(s)' optimizer states" "$tmp/r2.out" || bad "the resumed run has no tier"
if [ "$(losses "$tmp/r.jsonl")" = "$(losses "$tmp/ref.jsonl")" ]; then ok
else bad "stop at 2 + resume does not reproduce the --no-plugin losses"; fi

# 5. refusals
exec 9> "$tier/protrain-tier.rank0.lock"
flock -n 9 && echo 4242 >&9
if "$sh" --config "$tmp/tier2.ini" --plugin "$plug" "${model[@]}" > "$tmp/lock.out" 2>&1; then
    bad "a second run trained on a locked tier folder"
elif grep -q "is in use by another run (pid 4242" "$tmp/lock.out"; then ok
else bad "no lock sentence: $(tail -2 "$tmp/lock.out")"; fi
exec 9>&-
rm -f "$tier/protrain-tier.rank0.lock"
touch "$tmp/afile"
for p in "$tmp/missing" "$tmp/afile"; do
    ini "$tmp/bad.ini" "$p"
    "$sh" --config "$tmp/bad.ini" --plugin "$plug" "${model[@]}" > "$tmp/bad.out" 2>&1; rc=$?
    if [ $rc -eq 1 ] && grep -qE "cannot be used: No such file|is not a folder" "$tmp/bad.out"; then ok
    else bad "path $p: exit $rc, $(tail -1 "$tmp/bad.out")"; fi
done
# a file-size limit below the tier's file: EFBIG when it is reserved (SIGXFSZ ignored, as
# a host that sets the limit must)
(trap '' XFSZ; ulimit -f 1024; exec "$sh" --config "$tmp/tier2.ini" --plugin "$plug" "${model[@]}") \
    > "$tmp/fsz.out" 2>&1; rc=$?
if [ $rc -eq 1 ] && grep -q "file-size limit" "$tmp/fsz.out"; then ok
else bad "file-size limit: exit $rc, $(tail -1 "$tmp/fsz.out")"; fi
# a write-back failing as on a full disk: the next hook fails with the sentence, exit 1
ini "$tmp/full.ini" "$tier" "[testing]" "debug_tier_fail_write = 12"
"$sh" --config "$tmp/full.ini" --plugin "$plug" "${model[@]}" > "$tmp/full.out" 2>&1; rc=$?
if [ $rc -eq 1 ] && grep -q "failed with status 7: .*optimizer step was not taken: .*the disk is full" "$tmp/full.out"; then ok
else bad "a failed write-back: exit $rc, $(tail -1 "$tmp/full.out")"; fi
[ -z "$(ls -A "$tier")" ] && ok || bad "a refused run left files: $(ls -A "$tier")"

# 6. two ranks (mode B, each rank its own tier file): bit-identical to the same two
# ranks without the tier, and within 1e-6 of one rank with 2 micro-batches (the
# sum's order differs, as in tests/dist.sh). 5 MiB: the accumulated gradients
# (h_gacc, pinned) come on top with several micro-batches or ranks.
if command -v mpirun >/dev/null 2>&1; then
    tier_mpi_setup
    budget=5MiB ini "$tmp/m_t.ini" "$tier"
    budget=64MiB ini "$tmp/m_p.ini" ""
    m2=(--max-grad-norm 0.05)
    (cd "$tmp" && OMP_NUM_THREADS=1 "${mpi[@]}" "$sh" --config "$tmp/m_t.ini" --plugin "$plug" "${model[@]}" \
        "${m2[@]}" --metrics "$tmp/m2t.jsonl") > "$tmp/m2t.out" 2>&1 || bad "2 ranks with the tier failed: $(tail -2 "$tmp/m2t.out")"
    (cd "$tmp" && OMP_NUM_THREADS=1 "${mpi[@]}" "$sh" --config "$tmp/m_p.ini" --plugin "$plug" "${model[@]}" \
        "${m2[@]}" --metrics "$tmp/m2p.jsonl") > "$tmp/m2p.out" 2>&1 || bad "2 ranks without the tier failed"
    "$sh" --config "$tmp/m_t.ini" --plugin "$plug" "${model[@]}" "${m2[@]}" --grad-accum 2 \
        --metrics "$tmp/m1t.jsonl" > "$tmp/m1t.out" 2>&1 || bad "1 rank x 2 micro-batches with the tier failed"
    # staging_slots = auto took what the budget left (5 slots); the sums of 2
    # micro-batches then took slots back at the first step (without that the
    # first pre_step ran out of pinned budget)
    grep -q "nvme tier: 3 staging slot(s) instead of [4-9]" "$tmp/m1t.out" && ok ||
        bad "1 rank x 2 micro-batches: the automatic slots did not make room for the gradient sums"
    grep -q "nvme tier: [0-9]* read(s) .* 36 write(s)" "$tmp/m2t.out" && ok || bad "2 ranks: rank 0 did not step through the tier (36 write-backs: 9 chunks x 4 steps)"
    if [ "$(losses "$tmp/m2t.jsonl" | wc -l)" = 4 ] && [ "$(losses "$tmp/m2t.jsonl")" = "$(losses "$tmp/m2p.jsonl")" ]; then ok
    else bad "2 ranks: tier and pinned losses differ"; fi
    if tier_close "$tmp/m2t.jsonl" "$tmp/m1t.jsonl" 4 1e-6; then ok
    else bad "2 ranks vs 1 rank x 2 micro-batches: losses differ by more than 1e-6"; fi
fi

echo "nvme: $pass passed, $fail failed"
exit $fail
