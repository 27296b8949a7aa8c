#!/usr/bin/env bash
# The disk tier's level 2 ([nvme] path, runtime/store/tier/): whole chunk
# images (parameters, gradient landing zone, Adam states, gradient sums) on
# disk, pinned memory only the staging slots. sample_host's default model
# (L=4 C=128, 0.84M parameters) with every chunk the layout allows offloaded
# (n_persist 0) and [memory] pinned_budget = 4MiB:
#  - without [nvme] path it is refused (the chunks need 12.7 MB pinned), and
#    with the states alone on disk (level 1 forced) too;
#  - with it the tier picks level 2 by itself (and an automatic chunk size whose
#    three staging slots fit the budget) and trains bit-identical to
#    --no-plugin, with clipping and 2 micro-batches per step as well (deferred
#    steps, fp32 gradient sums in the records); the tier file exists while it
#    trains and is gone after; the pinned peak stays within the budget;
#  - a searched plan (device_capacity 32MiB) puts them there too and says so;
#  - negative controls ([testing] debug_skip_ordering): the tier's read skipped
#    (16384: an upload or step finds another chunk's image in the slot) or its
#    write-back dropped (32768: an evicted image comes back stale) breaks the
#    comparison;
#  - stopped after step 2 with a checkpoint generation and resumed: the same
#    losses (the tier is refilled from the state file); killed (-9) after
#    generation 2 and resumed: the same losses, no files left after;
#  - two ranks in mode C (each rank's parts in its own records): bit-identical
#    to the same ranks without the tier and within 1e-6 of one rank with two
#    micro-batches, pinned peak within the budget; mode B on two ranks is
#    refused with a sentence.
set -u
root="${PT_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}"
build="${PT_BUILD:-$root/build}"
sh="$build/sample_host"; plug="$build/protrain_plugin.so"
export PROTRAIN_TESTING=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
tmp=$(mktemp -d /tmp/test_nvme_img.XXXXXX)
trap '[ -n "${PT_KEEP:-}" ] || rm -rf "$tmp"' EXIT
fail=0; pass=0
bad() { echo "nvme_images: FAIL: $*"; fail=1; }
ok() { pass=$((pass + 1)); }
run=(--steps 4 --metrics-no-time --progress off --gen-every 0 --val-every 0)
tier="$tmp/tier"; mkdir -p "$tier"
ini() {   # ini FILE [nvme-path] [extra lines...]
    local f=$1 p=${2:-}; shift 2 2>/dev/null || shift $#
    { printf '[memory]\npinned_budget = 4MiB\n[protrain]\nauto_memory = false\nn_persist = 0\n'
      printf 'n_buffer = 8\nn_swap = 0\nn_checkpoint = 0\nauto_mode = false\nzero3_shard = off\n'
      [ -n "$p" ] && printf '[nvme]\npath = %s\n' "$p"
      for l in "$@"; do printf '%s\n' "$l"; done; } > "$f"
}
. "$root/tests/lib/tier_lib.sh"
same() { [ "$(losses "$1" | wc -l)" = 4 ] && [ "$(losses "$1")" = "$(losses "$2")" ]; }

"$sh" --no-plugin "${run[@]}" --metrics "$tmp/ref.jsonl" > /dev/null 2>&1 || bad "--no-plugin run failed"
"$sh" --no-plugin "${run[@]}" --max-grad-norm 0.05 --grad-accum 2 --metrics "$tmp/refc.jsonl" \
    > /dev/null 2>&1 || bad "--no-plugin run with clipping and 2 micro-batches failed"

# 1. the budget binds: no tier, and the states alone on disk, are refused
ini "$tmp/notier.ini" ""
if "$sh" --config "$tmp/notier.ini" --plugin "$plug" "${run[@]}" > "$tmp/notier.out" 2>&1; then
    bad "4 MiB without [nvme] path trained"
elif grep -q "pinned host memory: the offloaded chunks need" "$tmp/notier.out"; then ok
else bad "no pinned-budget sentence without the tier: $(tail -1 "$tmp/notier.out")"; fi
ini "$tmp/l1.ini" "$tier" "[testing]" "debug_tier_level = 1"
if "$sh" --config "$tmp/l1.ini" --plugin "$plug" "${run[@]}" > "$tmp/l1.out" 2>&1; then
    bad "4 MiB with only the Adam states on disk (level 1) trained: the test no longer needs level 2"
elif grep -q "pinned host memory: the offloaded chunks need" "$tmp/l1.out"; then ok
else bad "no pinned-budget sentence at level 1: $(tail -1 "$tmp/l1.out")"; fi

# 2. level 2 by itself: bit-identical, a file while it trains, none after, pinned peak in budget
ini "$tmp/t.ini" "$tier"
"$sh" --config "$tmp/t.ini" --plugin "$plug" "${run[@]}" --metrics "$tmp/t.jsonl" > "$tmp/t.out" 2>&1 &
pid=$!
seen=0
for _ in $(seq 1 500); do
    [ -f "$tier/protrain-tier.rank0.bin" ] && { seen=1; break; }
    kill -0 $pid 2>/dev/null || break
    sleep 0.01
done
wait $pid; rc=$?
if [ $rc -ne 0 ]; then bad "the level-2 run failed ($rc): $(tail -2 "$tmp/t.out")"
elif same "$tmp/t.jsonl" "$tmp/ref.jsonl"; then ok
else bad "level-2 losses differ from --no-plugin"; paste <(losses "$tmp/t.jsonl") <(losses "$tmp/ref.jsonl"); fi
grep -q "nvme tier: level 2, [0-9]* chunk(s)' whole images" "$tmp/t.out" && ok ||
    bad "the tier did not choose level 2: $(grep 'nvme tier' "$tmp/t.out" | head -2)"
[ $seen = 1 ] && ok || bad "no tier file appeared while the run trained"
[ -z "$(ls -A "$tier")" ] && ok || bad "the tier's files were left behind: $(ls -A "$tier")"
peak=$(sed -n 's/.*pinned peak \([0-9]*\) bytes (budget \([0-9]*\)).*/\1 \2/p' "$tmp/t.out" | tail -1)
if [ -z "$peak" ]; then bad "no pinned peak logged"
elif [ "${peak% *}" -gt 4194304 ] || [ "${peak#* }" != 4194304 ]; then bad "pinned peak ${peak% *} over 4194304"
else ok; fi

# clipping (steps deferred into the next forward) and 2 micro-batches (gradient sums)
if "$sh" --config "$tmp/t.ini" --plugin "$plug" "${run[@]}" --max-grad-norm 0.05 --grad-accum 2 \
    --metrics "$tmp/c.jsonl" > "$tmp/c.out" 2>&1 && same "$tmp/c.jsonl" "$tmp/refc.jsonl"; then ok
else bad "level 2 with clipping and 2 micro-batches differs from --no-plugin (or failed): $(tail -1 "$tmp/c.out")"; fi

# searched: the planner (profile, search) places the states on the tier at level 2
# itself, says so, and the rebuilds carry the state through the records
printf '[memory]\ndevice_capacity = 32MiB\npinned_budget = 4MiB\n[protrain]\nn_persist = 0\n[nvme]\npath = %s\n' \
    "$tier" > "$tmp/auto.ini"
if "$sh" --config "$tmp/auto.ini" --plugin "$plug" "${run[@]}" --metrics "$tmp/auto.jsonl" \
    > "$tmp/auto.out" 2>&1 && same "$tmp/auto.jsonl" "$tmp/ref.jsonl"; then ok
else bad "a searched plan at level 2 differs from --no-plugin (or failed): $(grep -m1 error "$tmp/auto.out")"; fi
grep -q "disk tier .*whole images on \[nvme\] path (level 2" "$tmp/auto.out" && ok ||
    bad "the searched plan does not say level 2"

# 3. negative controls
for bit in 16384 32768; do
    ini "$tmp/neg.ini" "$tier" "[testing]" "debug_skip_ordering = $bit"
    "$sh" --config "$tmp/neg.ini" --plugin "$plug" "${run[@]}" --metrics "$tmp/neg.jsonl" > "$tmp/neg.out" 2>&1
    if same "$tmp/neg.jsonl" "$tmp/ref.jsonl"; then
        bad "debug_skip_ordering = $bit still matches --no-plugin at level 2"
    else ok; fi
done

# 4. stop after step 2, resume: the tier refilled from the state file
ck="$tmp/ck"
"$sh" --config "$tmp/t.ini" --plugin "$plug" "${run[@]}" --checkpoint-dir "$ck" --stop-after 2 \
    --metrics "$tmp/r.jsonl" > "$tmp/r1.out" 2>&1 || bad "the run stopped at 2 failed: $(tail -1 "$tmp/r1.out")"
"$sh" --config "$tmp/t.ini" --plugin "$plug" "${run[@]}" --checkpoint-dir "$ck" --resume \
    --metrics "$tmp/r.jsonl" > "$tmp/r2.out" 2>&1 || bad "the resumed run failed: $(tail -2 "$tmp/r2.out")"
grep -q "nvme tier: level 2" "$tmp/r2.out" || bad "the resumed run has no level-2 tier"
same "$tmp/r.jsonl" "$tmp/ref.jsonl" && ok || bad "stop at 2 + resume does not reproduce the --no-plugin losses"

# kill -9 after generation 2 (the tier's file and lock stay behind, the lock
# released with the process), then --resume: the tier file is truncated and
# refilled, and the metrics (cut back to the generation and continued) hold the
# --no-plugin losses
ck2="$tmp/ck2"
"$sh" --config "$tmp/t.ini" --plugin "$plug" "${run[@]}" --checkpoint-dir "$ck2" --checkpoint-every 1 \
    --debug-save-sleep-ms 20 --metrics "$tmp/k1.jsonl" > "$tmp/k1.out" 2>&1 &
pid=$!
for _ in $(seq 1 1000); do
    [ -d "$ck2/gen-00000002" ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.01
done
kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
if [ ! -d "$ck2/gen-00000002" ]; then bad "the run to kill wrote no generation 2: $(tail -1 "$tmp/k1.out")"
else
    "$sh" --config "$tmp/t.ini" --plugin "$plug" "${run[@]}" --checkpoint-dir "$ck2" --checkpoint-every 1 \
        --resume --metrics "$tmp/k1.jsonl" > "$tmp/k2.out" 2>&1 || bad "the resume after kill -9 failed: $(tail -1 "$tmp/k2.out")"
    from=$(sed -n 's/.*resumed from .*step \([0-9]*\).*/\1/p' "$tmp/k2.out" | head -1)
    if [ -n "$from" ] && [ "$from" -ge 2 ] && same "$tmp/k1.jsonl" "$tmp/ref.jsonl"; then ok
    else bad "kill -9 + resume (from step ${from:-?}): losses differ from --no-plugin"; fi
fi
[ -z "$(ls -A "$tier")" ] && ok || bad "files left in the tier folder after the resumed run: $(ls -A "$tier")"

# 5. two ranks. Mode C (zero3_shard = on, each rank's parts in its own records):
# bit-identical to the same two ranks without the tier, within 1e-6 of one rank
# with 2 micro-batches (the sums' order differs, as in tests/dist.sh). Mode B
# (replicated): refused with the sentence.
if command -v mpirun >/dev/null 2>&1; then
    tier_mpi_setup
    sed 's/^zero3_shard = off$/zero3_shard = on/' "$tmp/t.ini" > "$tmp/c.ini"
    sed -e 's/^pinned_budget = 4MiB/pinned_budget = 64MiB/' -e '/^\[nvme\]/,$d' "$tmp/c.ini" > "$tmp/cp.ini"
    (cd "$tmp" && OMP_NUM_THREADS=1 "${mpi[@]}" "$sh" --config "$tmp/c.ini" --plugin "$plug" "${run[@]}" \
        --metrics "$tmp/c2.jsonl") > "$tmp/c2.out" 2>&1 || bad "mode C, 2 ranks, level 2 failed: $(grep -m1 error "$tmp/c2.out")"
    (cd "$tmp" && OMP_NUM_THREADS=1 "${mpi[@]}" "$sh" --config "$tmp/cp.ini" --plugin "$plug" "${run[@]}" \
        --metrics "$tmp/cp.jsonl") > "$tmp/cp.out" 2>&1 || bad "mode C, 2 ranks, pinned failed"
    "$sh" --config "$tmp/t.ini" --plugin "$plug" "${run[@]}" --grad-accum 2 --metrics "$tmp/c1.jsonl" \
        > "$tmp/c1.out" 2>&1 || bad "1 rank x 2 micro-batches at level 2 failed"
    grep -q "mode C" "$tmp/c2.out" && grep -q "nvme tier: level 2, [0-9]* chunk(s)' whole images" "$tmp/c2.out" && ok ||
        bad "the 2-rank run was not mode C at level 2"
    same "$tmp/c2.jsonl" "$tmp/cp.jsonl" && ok || bad "mode C: level-2 losses differ from the same ranks without the tier"
    if tier_close "$tmp/c2.jsonl" "$tmp/c1.jsonl" 4 1e-6; then ok
    else bad "mode C 2 ranks vs 1 rank x 2 micro-batches: losses differ by more than 1e-6"; fi
    peak=$(sed -n 's/.*pinned peak \([0-9]*\) bytes (budget \([0-9]*\)).*/\1/p' "$tmp/c2.out" | sort -n | tail -1)
    [ -n "$peak" ] && [ "$peak" -le 4194304 ] && ok || bad "mode C: pinned peak ${peak:-none} over 4194304"
    (cd "$tmp" && OMP_NUM_THREADS=1 "${mpi[@]}" "$sh" --config "$tmp/t.ini" --plugin "$plug" "${run[@]}") \
        > "$tmp/m2.out" 2>&1
    if grep -q "not for mode B on 2 ranks" "$tmp/m2.out"; then ok
    else bad "mode B, 2 ranks at level 2: no refusal sentence: $(grep -m1 error "$tmp/m2.out")"; fi
fi

echo "nvme_images: $pass passed, $fail failed"
exit $fail
