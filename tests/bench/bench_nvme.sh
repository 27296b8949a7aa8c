#!/usr/bin/env bash
# The disk tier ([nvme] path, docs/nvme.md) against pinned memory, sample_host on
# the simulated device. Two models whose offloaded chunks need more pinned memory
# than a small [memory] pinned_budget:
#   S  3 blocks x 96 channels, batch 2 x 64, 160 KiB chunks (tests/nvme.sh's):
#      5368320 pinned bytes, tiered at 4 MiB;
#   L  4 blocks x 192 channels, batch 4 x 64, 512 KiB chunks: 9596928 pinned
#      bytes, tiered at 8 MiB.
# Each model runs with its states in pinned memory (budget 64 MiB) and on the
# tier (the small budget), under a fixed plan (n_persist 0: every block chunk
# offloaded) and under a searched one (auto_memory with a profile; device
# capacity 6 / 40 MiB so the search offloads). Fixed plans also: S at 3 MiB, where
# the states alone on disk do not fit and the tier takes whole chunk images
# (level 2: parameters, gradients and states read before each use); L on the
# tier at 9 MiB too, where staging_slots = auto gets more slots than at 8 MiB (a
# block of L has 4 chunks: 6 slots read all of a block's steps ahead; the log says
# how many the budget left). Clipping off, so the CPU steps
# overlap backward. The runs alternate (reversed in every other repeat); a run's
# step is its median step (steps 6..N, from the metrics' tok_s), and every figure
# is the median over the repeats, ratios taken within a repeat first.
# Printed, per model:
#   - step time pinned vs tier (fixed plan) and the ratio;
#   - the tier's I/O hidden: 1 - tier_wait_s / tier_io_s (the metrics' counters,
#     pt_stats_v1 ABI 1.7), a lower bound on the share of the I/O that ran under
#     other work (waits on several threads add up);
#   - beside it the disk: the rates the tier timed at open (one record each way),
#     the bytes a step moves, and what the steps consume: bytes per step / the
#     pinned step time. Goal: hidden >= 90% where the probe's rate exceeds that
#     consumption (else the disk cannot keep up and the goal does not apply) and
#     the budget leaves the staging slots that read a block's steps ahead (the
#     tier's log says "more than the budget leaves" when it does not: then the
#     exposed I/O is the budget's price, reported, not a miss);
#   - searched plans (n_persist and n_buffer searched; CKPT and SWAP off, else
#     the search may keep enough chunks persistent to fit without the tier): the
#     plan's predicted iteration (pred_iter_s) vs the measured step, goal within
#     15%, judged on L only (S's 8-10 ms steps are scheduling noise here); where
#     the plan says "I/O time not modelled" the prediction has no term for the
#     tier, which the output says.
# Bars (PT_BENCH_STRICT=1 makes a miss fail): every tier arm's pinned peak
# (metrics pinned_peak) within its budget while every pinned arm's exceeds it,
# the tier arms' losses bit-identical to the pinned arms' under the fixed plan,
# and the two goals above. The tier's folder: $PT_NVME_DIR, else a fresh one
# under /var/tmp (disk-backed where /tmp is a tmpfs); its file system type is
# printed, and the tier's log says whether O_DIRECT was accepted.
set -u
root="${PT_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}"
build="${PT_BUILD:-$root/build}"
strict="${PT_BENCH_STRICT:-0}"
reps="${PT_BENCH_REPS:-5}"
sh="$build/sample_host"; plug="$build/protrain_plugin.so"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
tmp=$(mktemp -d /tmp/bench_nvme.XXXXXX)
base="${PT_NVME_DIR:-/var/tmp}"
tier=$(mktemp -d "$base/bench_nvme_tier.XXXXXX") || { echo "bench_nvme: cannot make a folder under $base"; exit 1; }
trap 'rm -rf "$tmp" "$tier"' EXIT
fstype=$(df -P -T "$tier" | awk 'NR == 2 { print $2 }')

# per model: sample_host flags, tokens per step, chunk size, tier budget, searched device capacity, steps
S_args=(--channels 96 --layers 3 --batch 2 --seq 64); S_tok=128; S_chunk=160KiB; S_budget=4MiB; S_cap=6MiB; S_steps=24
L_args=(--channels 192 --layers 4 --heads 4 --batch 4 --seq 64); L_tok=256; L_chunk=512KiB; L_budget=8MiB; L_cap=40MiB; L_steps=16
mib() { awk -v v="${1%MiB}" 'BEGIN { printf "%d", v * 1048576 }'; }
ini() {   # ini FILE CHUNK BUDGET fixed|CAP [STAGING_SLOTS]
    { printf '[plugin]\nlog_level = info\n[memory]\npinned_budget = %s\n' "$3"
      [ "$4" = fixed ] || printf 'device_capacity = %s\n' "$4"
      printf '[protrain]\nchunk_size = %s\n' "$2"
      # searched: n_persist and n_buffer (no CKPT / SWAP, which would let the search
      # keep more chunks persistent and fit the budget without the tier)
      [ "$4" = fixed ] || printf 'n_swap = 0\nn_checkpoint = 0\n'
      [ "$4" = fixed ] && printf 'auto_memory = false\nn_persist = 0\nn_buffer = 8\nn_swap = 0\nn_checkpoint = 0\nauto_mode = false\nzero3_shard = off\n'
      printf '[nvme]\npath = %s\n' "$tier"
      [ -n "${5:-}" ] && printf 'staging_slots = %s\n' "$5"; } > "$1"
}
jf() { sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" "$1"; }
med() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "nan" }'; }
ms() { awk -v v="$1" 'BEGIN { printf "%.2f", v * 1e3 }'; }
# a run's median step in seconds (steps 6..): tokens per step / tok_s
step_s() { jf "$1" tok_s | tail -n +6 | awk -v t="$2" '$1 > 0 { print t / $1 }' | med; }
# the median over the repeats of FIELD's last value in model M, arm A's metrics
last() { for r in $(seq 1 "$reps"); do jf "$tmp/$1.$2.$r.jsonl" "$3" | tail -1; done | med; }
# ratio M A B: the median over the repeats of arm A's step / arm B's (tok: per step)
ratio() {
    for r in $(seq 1 "$reps"); do
        awk -v a="$(step_s "$tmp/$1.$2.$r.jsonl" "$tok")" -v b="$(step_s "$tmp/$1.$3.$r.jsonl" "$tok")" 'BEGIN { print a / b }'
    done | med
}

# arms: pin / tier (fixed plan), apin / atier (searched); S also tier2, L tier9
arms_S=(pin tier tier2 apin atier); arms_L=(pin tier tier9 apin atier)
budget_of() { case $2 in pin|apin) echo 64MiB ;; tier9) echo 9MiB ;; tier2) echo 3MiB ;; *) eval "echo \$${1}_budget" ;; esac; }
for m in S L; do
    eval "c=\$${m}_chunk cap=\$${m}_cap arms=(\"\${arms_${m}[@]}\")"
    for a in "${arms[@]}"; do
        plan=fixed; case $a in a*) plan=$cap ;; esac
        slots=
        ini "$tmp/$m.$a.ini" "$c" "$(budget_of $m $a)" "$plan" $slots
    done
done
t0=$(date +%s)
for rep in $(seq 1 "$reps"); do
    for m in S L; do
        eval "args=(\"\${${m}_args[@]}\") steps=\$${m}_steps arms=(\"\${arms_${m}[@]}\")"
        order=("${arms[@]}")   # alternate the order: reversed in even repeats
        [ $((rep % 2)) = 0 ] && for i in "${!arms[@]}"; do order[$i]=${arms[$((${#arms[@]} - 1 - i))]}; done
        for a in "${order[@]}"; do
            out="$tmp/$m.$a.$rep"
            "$sh" --config "$tmp/$m.$a.ini" --plugin "$plug" "${args[@]}" --steps "$steps" --max-grad-norm 0 \
                --val-every 0 --gen-every 0 --progress off --metrics "$out.jsonl" > "$out.log" 2>&1 ||
                { tail -3 "$out.log"; echo "bench_nvme: model $m, arm $a failed"; exit 1; }
        done
    done
done
echo "bench_nvme: $reps repeats in $(($(date +%s) - t0)) s; tier folder on $fstype ($base), $(grep -ho 'O_DIRECT I/O\|buffered (O_DIRECT refused here)' "$tmp"/S.tier.1.log | head -1)"

fail=0
miss() { echo "bench_nvme: MISSED: $*"; fail=1; }
# tier_report M A LABEL: the tier's counters (since it opened), the disk's rates,
# what a step moves; the 90% goal where the disk keeps up
tier_report() {
    local m=$1 a=$2 hid io wt rd wr mv rmb wmb need t_disk
    hid=$(for r in $(seq 1 "$reps"); do
        f="$tmp/$m.$a.$r.jsonl"
        awk -v io="$(jf "$f" tier_io_s | tail -1)" -v w="$(jf "$f" tier_wait_s | tail -1)" \
            'BEGIN { if (io > 0) print 1 - w / io }'; done | med)
    io=$(last "$m" "$a" tier_io_s); wt=$(last "$m" "$a" tier_wait_s)
    wr=$(for r in $(seq 1 "$reps"); do sed -n 's/.*one record written in [0-9.]* ms (\([0-9]*\) MB\/s).*/\1/p' "$tmp/$m.$a.$r.log" | head -1; done | med)
    rd=$(for r in $(seq 1 "$reps"); do sed -n 's/.*one record .*, read in [0-9.]* ms (\([0-9]*\) MB\/s).*/\1/p' "$tmp/$m.$a.$r.log" | head -1; done | med)
    # MiB read / written since it opened, from the tier's closing line
    mv=$(sed -n 's/.*nvme tier: [0-9]* read(s) \([0-9.]*\) MiB in .*, [0-9]* write(s) \([0-9.]*\) MiB in.*/\1 \2/p' "$tmp/$m.$a.1.log" | tail -1)
    rmb=${mv% *}; wmb=${mv#* }
    # what the steps consume: the tier's bytes per step (both ways) per pinned
    # step; the disk keeps up when its probe rates move them in less than a step
    need=$(awk -v r="$rmb" -v w="$wmb" -v n="$steps" -v s="${st[pin]}" 'BEGIN { printf "%.0f", (r + w) * 1048576 / n / s / 1e6 }')
    t_disk=$(awk -v r="$rmb" -v w="$wmb" -v n="$steps" -v R="$rd" -v W="$wr" -v s="${st[pin]}" \
        'BEGIN { if (R > 0 && W > 0) print (r * 1048576 / n / (R * 1e6) + w * 1048576 / n / (W * 1e6)) / s; else print 99 }')
    lv=$(sed -n 's/.*nvme tier: level \([0-9]\),.*/\1/p' "$tmp/$m.$a.1.log" | tail -1)
    printf 'bench_nvme: model %s, %s, level %s: tier I/O %.3f s (I/O threads), waited %.3f s: hidden %.1f%%; disk probe write %s MB/s, read %s MB/s; a step moves %.2f + %.2f MiB, %s MB/s at the pinned step time (one thread at the probe rates: %.2f of a step)\n' \
        "$m" "$3" "${lv:-?}" "$io" "$wt" "$(awk -v h="$hid" 'BEGIN { print h * 100 }')" "$wr" "$rd" \
        "$(awk -v v="$rmb" -v n="$steps" 'BEGIN { print v / n }')" "$(awk -v v="$wmb" -v n="$steps" 'BEGIN { print v / n }')" \
        "$need" "$t_disk"
    if awk -v h="$hid" 'BEGIN { exit !(h >= 0.90) }'; then echo "bench_nvme: model $m, $3: hidden >= 90%: met"
    elif ! awk -v t="$t_disk" 'BEGIN { exit !(t <= 1) }'; then
        echo "bench_nvme: model $m, $3: the disk needs more than a step for a step's states at its probe rates: the 90% goal does not apply"
    elif grep -q "more than the budget leaves" "$tmp/$m.$a.1.log"; then
        # the disk keeps up, but pinned_budget leaves fewer staging slots than
        # reading a block ahead takes: the exposed part is the budget's price
        echo "bench_nvme: model $m, $3: fewer staging slots than a block's reads ahead need (the budget): the 90% goal does not apply; $(grep -o 'auto: [0-9]* read a block ahead' "$tmp/$m.$a.1.log" | head -1)"
    else miss "model $m, $3: tier I/O hidden $(awk -v h="$hid" 'BEGIN { printf "%.1f", h * 100 }')% < 90% with a disk that keeps up"; fi
}
for m in S L; do
    eval "args=(\"\${${m}_args[@]}\") steps=\$${m}_steps tok=\$${m}_tok arms=(\"\${arms_${m}[@]}\")"   # tok: batch x seq
    declare -A st=()
    for a in "${arms[@]}"; do
        st[$a]=$(for r in $(seq 1 "$reps"); do step_s "$tmp/$m.$a.$r.jsonl" "$tok"; done | med)
        # the budget is a cap the tier keeps, and one the pinned states exceed
        budget=$(mib "$(budget_of $m ${a/pin/tier})")
        for r in $(seq 1 "$reps"); do
            p=$(jf "$tmp/$m.$a.$r.jsonl" pinned_peak | tail -1)
            case $a in
                *tier*) [ "$p" -le "$budget" ] 2>/dev/null || miss "model $m $a run $r: pinned peak $p over the budget $budget" ;;
                *) [ "$p" -gt "$budget" ] 2>/dev/null || miss "model $m $a run $r: pinned peak $p within $budget: the tier is not needed" ;;
            esac
        done
    done
    for t in tier tier2 tier9; do
        [ -n "${st[$t]:-}" ] || continue
        for r in $(seq 1 "$reps"); do
            [ "$(jf "$tmp/$m.$t.$r.jsonl" loss)" = "$(jf "$tmp/$m.pin.$r.jsonl" loss)" ] ||
                miss "model $m run $r: the losses of $t differ from pinned memory's"
        done
        [ "$(last $m pin pinned_peak)" -gt "$(mib "$(budget_of $m $t)")" ] ||
            miss "model $m: the pinned states fit $(budget_of $m $t): $t does not need the tier"
        printf 'bench_nvme: model %s (%s), fixed plan, n_persist 0: step pinned %s ms, %s %s ms: x%.3f; pinned peak %s vs %s bytes (budget %s)\n' \
            "$m" "${args[*]}" "$(ms "${st[pin]}")" "$t" "$(ms "${st[$t]}")" "$(ratio "$m" "$t" pin)" \
            "$(last $m pin pinned_peak)" "$(last $m $t pinned_peak)" "$(mib "$(budget_of $m $t)")"
        sl=$(sed -n 's/.*plus [0-9]* of staging (\([0-9]*\) slots.*/\1/p' "$tmp/$m.$t.1.log" | tail -1)
        tier_report "$m" "$t" "$t ($(budget_of $m $t), ${sl:-?} staging slots)"
    done
    for a in apin atier; do
        pr=$(last "$m" "$a" pred_iter_s)
        x=$(for r in $(seq 1 "$reps"); do
            awk -v m="$(step_s "$tmp/$m.$a.$r.jsonl" "$tok")" -v p="$(jf "$tmp/$m.$a.$r.jsonl" pred_iter_s | tail -1)" \
                'BEGIN { if (p > 0) print m / p; else print 0 }'; done | med)
        # the plan the run ended with (the last one printed)
        lg="$tmp/$m.$a.1.log"
        plan="n_persist $(grep '^protrain info:   n_persist ' "$lg" | tail -1 | awk '{ print $4 }')"
        plan="$plan, n_buffer $(grep '^protrain info:   n_buffer ' "$lg" | tail -1 | awk '{ print $4 }')"
        plan="$plan, $(grep -q '^protrain info:   disk tier ' "$lg" && echo 'states on the tier' || echo 'states pinned')"
        what='pinned (64MiB)'
        if [ $a = atier ]; then
            what="tier ($(budget_of $m atier))"
            grep -q "I/O time not modelled" "$lg" && what="$what, the prediction without the tier's I/O (not modelled)"
        fi
        printf 'bench_nvme: model %s: searched, %s: predicted iteration %.2f ms, measured step %.2f ms: x%.3f (%s)\n' "$m" \
            "$what" \
            "$(ms "$pr")" "$(ms "${st[$a]}")" "$x" "$plan"
        if [ $m = S ]; then :   # 8-10 ms steps: scheduling noise on a shared machine, reported only
        elif ! grep -q '^protrain info:   disk tier ' "$lg" && [ $a = atier ]; then
            miss "model $m, searched $a: the plan keeps the states pinned at $(budget_of $m atier)"
        elif awk -v x="$x" 'BEGIN { exit !(x >= 0.85 && x <= 1.15) }'; then
            echo "bench_nvme: model $m, searched $a: within 15%: met"
        else miss "model $m, searched $a: measured / predicted iteration x$x, outside [0.85, 1.15]"; fi
    done
    unset st
done
[ $fail = 0 ] && echo "bench_nvme: every bar met"
[ "$strict" = 1 ] && exit $fail
exit 0
