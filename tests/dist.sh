#!/usr/bin/env bash
# Data parallel on the host backend with MPI (mpirun -np 2), against the oracle
# of one rank accumulating the same batches: 2 ranks with micro-batch B must
# train like 1 rank with B and --grad-accum 2 (rank r takes batch r of every 2,
# which are the 1-rank run's micro-batches 0 and 1), with clipping on, in
#   mode A: every chunk resident ([protrain] force_all_persistent = true);
#   mode B: chunks streamed, CPU Adam on offloaded chunks (n_persist = 0);
#   mode C: as B with zero3_shard = on (each rank keeps, reduces and steps only
#           its part of every offloaded chunk); CS: mode C with one SWAP and one
#           CKPT block. One rank runs them as mode B (sharding needs ranks).
# Checked per run pair:
#   - step 1's loss is bit-identical (the batches and the loss all-reduce are
#     exact: the loss precedes any update);
#   - every step's loss agrees to a relative 1e-6. Not bit-identical after the
#     first update because of one rounding order: the sample host's backward adds
#     micro-batch 2's contributions element by element onto micro-batch 1's
#     resident gradient (g1 + a1 + a2 + ...), while the all-reduce adds two
#     finished per-rank gradients (g1 + (a1 + a2 + ...)); measured ~4e-9.
#     Offloaded chunks are summed the same way on both sides (fp32 accumulator,
#     rank order), so mode B differs only through its resident chunks;
#   - metrics carry "world" (1 / 2) and "mode" ("A" / "B" / "C"), and only rank 0
#     writes them.
# Mode C against mode B, both 2 ranks: every loss bit-identical (the
# reduce-scatter forms each part with the all-reduce's rank-order sum, and AdamW
# is elementwise; the clipping norm's per-rank partial sums are in double, so the
# fp32 clip factor comes out the same), and rank 0's pinned bytes at most half of
# mode B's plus one chunk (the parts' padding), and below mode B's.
# REKLS (modes AR, BR, CR): 2 ranks vs 1 rank x grad-accum 2 within 3e-4 (see below), its
# device path (A) and CPU path (B) bit-identical with 1 and with 2 ranks, and mode C
# (each REKLS param stepped whole by one owner rank) bit-identical to mode B (below).
# And a dead rank: with [testing] debug_hang_rank = 1 and [dist] timeout = 2, rank 0 must
# exit non-zero within 20 s with an error naming rank 1 (not hang).
set -u
root="${PT_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}"
build="${PT_BUILD:-$root/build}"
if ! command -v mpirun >/dev/null 2>&1; then
    # the plugin links MPI, so a machine that built it without mpirun lacks a
    # dependency: nothing here ran, which must not read as a pass
    echo "dist: FAIL: mpirun is not installed, so no rank ran (make deps installs openmpi-bin)"; exit 1
fi
if [ -n "${PT_SAN:-}" ]; then
    # Open MPI's own allocations would be reported as leaks by LeakSanitizer
    export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
    # and TSan's reports from inside Open MPI's uninstrumented libraries
    export TSAN_OPTIONS="${TSAN_OPTIONS:-} suppressions=$(cd "$(dirname "$0")" && pwd)/tsan_openmpi.supp"
fi
fail=0; pass=0
bad() { echo "dist: FAIL: $*"; fail=1; }
ok() { pass=$((pass + 1)); }
tmp=$(mktemp -d /tmp/test_dist.XXXXXX)
trap '[ -n "${PT_KEEP:-}" ] || rm -rf "$tmp"' EXIT
sh="$build/sample_host"; plug="$build/protrain_plugin.so"
mpi=(mpirun --oversubscribe --allow-run-as-root -np 2)
# The training text is made here, the same on every machine and for every tree:
# sample_host's default corpus is the repository's own source text, so with it
# every edit would change the data, and the bounds below (REKLS amplifies
# rounding differences by an amount that depends on the data) would hold for
# one tree and not the next. Words picked by a Park-Miller generator (its
# products stay below 2^53, so every awk computes the same sequence).
awk 'BEGIN {
    n = split("the of and a to in is you that it he was for on are as with his they at be " \
              "this have from or one had by word but not what all were we when your can said " \
              "there use an each which she do how their if will up other about out many then " \
              "them these so some her would make like him into time has look two more write go " \
              "see number no way could people my than first water been call who oil its now " \
              "find long down day did get come made may part", w, " ")
    s = 12345
    for (i = 0; i < 24000; i++) {
        s = (s * 16807) % 2147483647
        printf "%s%s", w[s % n + 1], (s % 11 == 0 ? ".\n" : " ")
    }
}' > "$tmp/corpus.txt"
common=(--data "$tmp/corpus.txt"
        --layers 2 --heads 2 --channels 32 --vocab 256 --seq 16 --batch 2 --steps 6
        --max-grad-norm 0.05 --lr 1e-3 --warmup 2 --val-every 0 --gen-every 0
        --metrics-no-time --quiet --progress off --plugin "$plug")
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
# the negative controls and the hung rank below use [testing] keys
export PROTRAIN_TESTING=1

base_ini() {   # $1 = file, $2 = mode-specific [protrain] lines
    printf '[plugin]\nbackend = host\nlog_level = warn\n[protrain]\nauto_mode = false\n%b\n' \
        "$2" > "$1"
    printf '[optimizer]\ncpu_threads = 1\n[dist]\ntimeout = 20\n' >> "$1"
}
base_ini "$tmp/A.ini" 'force_all_persistent = true'
base_ini "$tmp/B.ini" 'auto_memory = false\nn_persist = 0\nn_buffer = 12\nn_swap = 0\nn_checkpoint = 0\nchunk_size = 16384'
# AT: mode A with the MLPs in 3 tiles on every rank (TiledMLP composes with ranks)
base_ini "$tmp/AT.ini" 'force_all_persistent = true'
base_ini "$tmp/C.ini" 'auto_memory = false\nn_persist = 0\nn_buffer = 12\nn_swap = 0\nn_checkpoint = 0\nchunk_size = 16384\nzero3_shard = on'
base_ini "$tmp/CS.ini" 'auto_memory = false\nn_persist = 0\nn_buffer = 12\nn_swap = 1\nn_checkpoint = 1\nchunk_size = 16384\nzero3_shard = on'
base_ini "$tmp/BS.ini" 'auto_memory = false\nn_persist = 0\nn_buffer = 12\nn_swap = 1\nn_checkpoint = 1\nchunk_size = 16384'
printf '[tiled_mlp]\nenabled = true\ntiles = 3\n' >> "$tmp/AT.ini"
# AR / BR: modes A and B with REKLS (the INI's optimizer: --optimizer ini); every rank
# steps the averaged gradient, so the ranks' eigendecompositions must agree bit for bit
for m in A B C; do
    sed 's/^cpu_threads = 1$/cpu_threads = 1\ntype = rekls\nbeta2 = 0.95\nweight_decay = 0.01\nmax_grad_norm = 0.05\nlr = 1e-3/' \
        "$tmp/$m.ini" > "$tmp/${m}R.ini"
done
# AO / BO: modes A and B with OSFT on every projection; unfreeze_rank_ratio 0.4 of
# rank 32 freezes k = 19 and trains 13 directions (neither divides by 2), over 15
# token rows per rank (batch 1 x seq 15). The
# gradient projection runs on each rank's own gradient before the all-reduce
# (it is linear, so the sum of projections is the projection of the sum).
osft='[osft]\nenabled = true\nunfreeze_rank_ratio = 0.4\ntargets = qkvw,attprojw,fcw,fcprojw\n'
cp "$tmp/A.ini" "$tmp/AO.ini"; printf "$osft" >> "$tmp/AO.ini"
cp "$tmp/B.ini" "$tmp/BO.ini"; printf "$osft" >> "$tmp/BO.ini"
# CO: mode C with OSFT. A rank holds a byte range of each chunk, so the value
# projection gathers a split factor whole on every rank, projects it as one
# rank does and keeps its own part: the same bits as BO (checked below).
cp "$tmp/C.ini" "$tmp/CO.ini"; printf "$osft" >> "$tmp/CO.ini"
# COF: CO with [osft] cache_frozen (the frozen factors gathered once and kept)
cp "$tmp/CO.ini" "$tmp/COF.ini"; printf 'cache_frozen = true\n' >> "$tmp/COF.ini"

# field value of every line: jf FILE KEY
jf() { sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" "$1"; }
# A negative control's run "went wrong" only when it ran to its end and trained
# otherwise: either all 6 steps with numeric losses that differ from the ordered
# run's, or a non-finite loss that sample_host stopped at with its own sentence
# (and no other error) after at least one logged step. A refusal, a crash, a
# timeout or missing metrics do not count: they would pass a blind check.
# went_wrong NAME ORDERED_JSON RC; sets why.
went_wrong() {
    local j="$tmp/$1.json" l="$tmp/$1.log" rc=$3
    why="exit $rc, losses $(jf "$j" loss 2>/dev/null | tr '\n' ' ')"
    [ -s "$j" ] || { why="$why (no metrics)"; return 1; }
    if [ "$rc" = 0 ]; then
        [ "$(jf "$j" loss | grep -c '^-\?[0-9]')" = 6 ] && [ "$(jf "$j" loss)" != "$(jf "$2" loss)" ]
        return
    fi
    grep -q "error: the training loss is not finite" "$l" &&
        ! grep -v "error: the training loss is not finite" "$l" |
            grep -qE "error:|exited on signal|Segmentation fault|core dumped" || {
        why="$why (stopped by something else than a non-finite loss: $(grep -E 'error:|signal' "$l" | grep -v 'not finite' | head -1))"
        return 1; }
}

# max over the steps of |a - b| / a for the losses of two metrics files; "count n m"
# unless both have 6 numeric losses
rel_max() {
    awk -v a="$(jf "$1" loss | tr '\n' ' ')" -v b="$(jf "$2" loss | tr '\n' ' ')" 'BEGIN {
        n = split(a, x, " "); m = split(b, y, " ");
        if (n != 6 || m != 6) { print "count " n " " m; exit }
        w = 0; for (i = 1; i <= n; i++) { if (y[i] !~ /^-?[0-9]/) { print "not a number: " y[i]; exit }
            d = x[i] - y[i]; if (d < 0) d = -d; r = d / x[i]; if (r > w) w = r }
        printf "%.3g", w }'
}

# The sharded collectives themselves (tests/unit/test_coll.c): all-gather and
# reduce-scatter against independent oracles, 2 and 3 ranks (3: parts of unequal
# length, and a sum order that shows).
for np in 2 3; do
    if (cd "$tmp" && mpirun --oversubscribe --allow-run-as-root -np $np "$build/tests/test_coll") \
            >"$tmp/coll$np.log" 2>&1; then
        ok; echo "dist: all-gather / reduce-scatter on $np ranks: $(grep -c PASSED "$tmp/coll$np.log") ranks passed"
    else
        grep -E "ERROR|FAILED|error" "$tmp/coll$np.log" | head -5; bad "test_coll on $np ranks failed"
    fi
done

rekls_tol=3e-4   # REKLS 2 ranks vs 1 rank x grad-accum 2 (relative loss; see below)
for mode in A B AT AO BO CO AR BR CR C CS BS; do
    want=${mode:0:1}   # the execution mode the plugin must report
    want1=$want; [ "$want" = C ] && want1=B   # one rank cannot shard
    extra=()   # OSFT: 1 x 15 = 15 token rows per rank (odd), on top of the odd ranks
    case $mode in AO|BO|CO) extra=(--batch 1 --seq 15) ;; AR|BR|CR) extra=(--optimizer ini) ;; esac
    # --save (modes B and C, compared below): every rank reads the parameters
    # back, rank 0 writes (mode C gathers them)
    save=()
    case $mode in B|C|BS|CS|BO|CO|BR|CR) save=(--save "$tmp/$mode.2.bin") ;; esac
    m1="$tmp/$mode.1.json"; m2="$tmp/$mode.2.json"
    if ! "$sh" --config "$tmp/$mode.ini" "${common[@]}" "${extra[@]}" --grad-accum 2 --metrics "$m1" \
            >"$tmp/$mode.1.log" 2>&1; then
        cat "$tmp/$mode.1.log"; bad "mode $mode: the 1-rank --grad-accum 2 run failed"; continue
    fi
    if ! (cd "$tmp" && "${mpi[@]}" "$sh" --config "$tmp/$mode.ini" "${common[@]}" "${extra[@]}" --grad-accum 1 \
            --metrics "$m2" "${save[@]}") >"$tmp/$mode.2.log" 2>&1; then
        tail -20 "$tmp/$mode.2.log"; bad "mode $mode: the 2-rank run failed"; continue
    fi
    [ "$(jf "$m1" world | sort -u)" = 1 ] && [ "$(jf "$m2" world | sort -u)" = 2 ] && ok ||
        bad "mode $mode: world fields are '$(jf "$m1" world | sort -u)' / '$(jf "$m2" world | sort -u)', want 1 / 2"
    [ "$(jf "$m2" mode | sort -u)" = "\"$want\"" ] && [ "$(jf "$m1" mode | sort -u)" = "\"$want1\"" ] && ok ||
        bad "mode $mode: the plugin ran mode '$(jf "$m2" mode | sort -u)' (2 ranks) / '$(jf "$m1" mode | sort -u)' (1 rank)"
    [ "$(wc -l < "$m2")" = 6 ] && ok || bad "mode $mode: rank 0's metrics have $(wc -l < "$m2") lines, want 6 (one writer)"
    l1=$(jf "$m1" loss | tr '\n' ' '); l2=$(jf "$m2" loss | tr '\n' ' ')
    [ "$(jf "$m1" loss | head -1)" = "$(jf "$m2" loss | head -1)" ] && ok ||
        bad "mode $mode: step 1 loss $(jf "$m1" loss | head -1) (1 rank) != $(jf "$m2" loss | head -1) (2 ranks)"
    res=$(awk -v a="$l1" -v b="$l2" 'BEGIN { n = split(a, x, " "); m = split(b, y, " ");
        if (n != 6 || m != 6) { print "count " n " " m; exit }
        w = 0; for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < 0) d = -d; r = d / x[i];
            if (r > w) w = r }
        printf "%.3g", w }')
    # REKLS turns the ~1e-9 gradient rounding difference (see the top) into
    # 1.81e-4 on this script's corpus (AR, BR and CR alike, in the plain and
    # the asan build; the runs are deterministic, and the number depends on the
    # data, 5e-5 .. 1.1e-4 on other texts): at eps = 1e-8 its Adam ratio g / (|g| + eps) maps
    # round-off-sized rotated gradients to +-1 (the fp32 sensitivity its unit
    # test documents). The bound, $rekls_tol, sits below the 7e-4 .. 2.5e-3 that
    # a missing gradient-bucket wait moves the same run by (the control after
    # this loop must exceed it).
    tol=1e-6; [ "${mode:1:1}" = R ] && tol=$rekls_tol
    if awk -v r="$res" -v t="$tol" 'BEGIN { exit !(r ~ /^[0-9.e+-]+$/ && r + 0 <= t + 0) }'; then
        ok; echo "dist: mode $mode: 2 ranks vs 1 rank x grad-accum 2: step 1 bit-identical, max relative loss difference $res over 6 steps (bound $tol)"
    else
        bad "mode $mode: losses differ by $res (relative), more than $tol: 1 rank: $l1 / 2 ranks: $l2"
    fi
done
# Control for the REKLS bound: mode AR on 2 ranks under 1 ms compute jitter with
# the gradient buckets' wait skipped (debug_skip_ordering = 1024: a bucket is
# reduced before the device wrote it) must complete and differ from the 1-rank
# run by more than $rekls_tol (measured 7.3e-4 .. 2.5e-3 over nine runs under
# 1 ms jitter: the race decides how much, and a later device corrupts more,
# hence 2 ms here), so a bound this tight sees an ordering bug of that size.
(cat "$tmp/AR.ini"; printf '[testing]\ncompute_jitter = 2ms\ndebug_skip_ordering = 1024\n') > "$tmp/ARJN.ini"
(cd "$tmp" && "${mpi[@]}" "$sh" --config "$tmp/ARJN.ini" "${common[@]}" --optimizer ini \
    --metrics "$tmp/ARJN.json") >"$tmp/ARJN.log" 2>&1
nrc=$?
res=$(rel_max "$tmp/AR.1.json" "$tmp/ARJN.json")
if [ $nrc = 0 ] && awk -v r="$res" -v t="$rekls_tol" 'BEGIN { exit !(r ~ /^[0-9.e+-]+$/ && r + 0 > t + 0) }'; then
    ok; echo "dist: negative control: REKLS mode A without the bucket wait: max relative loss difference $res, above the bound $rekls_tol"
else
    tail -3 "$tmp/ARJN.log"; bad "negative control: REKLS mode A with debug_skip_ordering = 1024: exit $nrc, max relative loss difference '$res', not above $rekls_tol: the bound is blind to it"
fi
# REKLS on the device (mode A) and on the CPU workers (mode B) take the same
# all-reduced gradients and must give the same bits, with 2 ranks as with 1
for r in 1 2; do
    [ -s "$tmp/AR.$r.json" ] && [ "$(jf "$tmp/AR.$r.json" loss)" = "$(jf "$tmp/BR.$r.json" loss)" ] && ok ||
        bad "REKLS: mode A and mode B losses differ with $r rank(s)"
done
[ "$(jf "$tmp/AR.2.json" loss)" != "$(jf "$tmp/A.2.json" loss)" ] && ok ||
    bad "REKLS: the REKLS run reports AdamW's losses (the INI optimizer was not used)"
echo "dist: REKLS: modes A (device) and B (CPU) bit-identical with 1 and with 2 ranks"

# Tensor-parallel REKLS on 2 and 4 ranks: every rank's shard bit-identical to
# single-rank REKLS of the full matrix over 5 steps (rows and columns split),
# non-divisible shapes refused (tests/integ/test_rekls_tp.c).
for np in 2 4; do
    if (cd "$tmp" && timeout 120 mpirun --oversubscribe --allow-run-as-root -np $np \
            "$build/tests/test_rekls_tp") >"$tmp/tp$np.log" 2>&1; then
        ok; echo "dist: tensor-parallel REKLS on $np ranks: shards bit-identical to single-rank REKLS"
    else
        tail -20 "$tmp/tp$np.log"; bad "tensor-parallel REKLS on $np ranks failed"
    fi
done

# The same wired into the plugin (weights declared split through
# pt_param_v1.tp_split by a hook-level host, tests/integ/test_tp_plugin.c):
# resident (mode A), offloaded (mode B), clipped, 2 micro-batches, l2 decay
# with beta2 = auto, weight_decay = auto (REKLS and AdamW), bf16 weights, every
# block weight split and resident (no device REKLS workspace or eigh status),
# save/load mid-run, the planner's trace and plan file; every rank's shards
# bit-identical to single-rank REKLS over 5 steps. "np tp": tp_size = np is one
# tensor-parallel group; 4 ranks with tp_size 2 are 2 groups, data parallel
# across them (gradients averaged over the replicas of each shard).
# OPENBLAS_NUM_THREADS=1: the byte comparison below is between processes, and
# LAPACK's eigh gives other bits with another thread count (inside one run the
# plugin and the oracle share it).
for cfg in "2 2" "4 4" "4 2"; do
    set -- $cfg
    if (cd "$tmp" && OPENBLAS_NUM_THREADS=1 TP_SIZE=$2 TP_DUMP="$tmp/tpd.$1.$2" \
            timeout 300 mpirun --oversubscribe --allow-run-as-root -np $1 \
            "$build/tests/test_tp_plugin") >"$tmp/tpp$1.$2.log" 2>&1; then
        ok; echo "dist: REKLS in the plugin, $1 ranks, tp_size $2: shards bit-identical to single-rank REKLS"
    else
        tail -20 "$tmp/tpp$1.$2.log"; bad "REKLS in the plugin on $1 ranks with tp_size $2 failed"
    fi
done
# tp 2 x dp 2 (batches 0 and 1 on the two replicas) against tp 2 alone with the
# same two batches as 2 micro-batches: the same shards byte for byte, in mode A
# and mode B, on both replicas; control: tp 2 on batch 0 alone differs.
for pl in A B; do
    same=1
    for r in 0 1 2 3; do
        cmp -s "$tmp/tpd.4.2.$pl.$r" "$tmp/tpd.2.2.${pl}2.$((r % 2))" || same=0
    done
    if [ $same = 1 ] && ! cmp -s "$tmp/tpd.4.2.$pl.0" "$tmp/tpd.2.2.$pl.0"; then
        ok; echo "dist: mode $pl, tp 2 x dp 2 = tp 2 with 2 micro-batches over the same batches: shards byte-identical (5 steps)"
    else
        bad "mode $pl: tp 2 x dp 2 and tp 2 with 2 micro-batches give other shards (or the control matched)"
    fi
done

# Mode C against mode B on 2 ranks: the same losses bit for bit, the same saved
# weights byte for byte, half the pinned bytes.
S=16384   # chunk_size above: the padding allowance
for pair in "C B" "CS BS" "CO BO"; do
    set -- $pair
    mc="$tmp/$1.2.json"; mb="$tmp/$2.2.json"
    [ -s "$mc" ] && [ -s "$mb" ] || { bad "mode $1 vs $2: a 2-rank run above failed"; continue; }
    if [ "$(jf "$mc" loss)" = "$(jf "$mb" loss)" ]; then
        ok; echo "dist: mode $1 vs mode $2 (2 ranks): all 6 losses bit-identical"
    else
        bad "mode $1 vs $2: losses differ: C: $(jf "$mc" loss | tr '\n' ' ') / B: $(jf "$mb" loss | tr '\n' ' ')"
    fi
    if [ -s "$tmp/$1.2.bin" ] && cmp -s "$tmp/$1.2.bin" "$tmp/$2.2.bin"; then
        ok; echo "dist: mode $1 vs mode $2: the weights --save wrote are byte-identical"
    else
        bad "mode $1 vs $2: the --save files differ or are missing"
    fi
    pc=$(jf "$mc" pinned_bytes | tail -1); pb=$(jf "$mb" pinned_bytes | tail -1)
    # the SWAP pool holds this rank's own activations, the same in B and C: the
    # bound is on the model states (BS - B measures the pool)
    pool=0; [ "$2" = BS ] && pool=$(( $(jf "$mb" pinned_bytes | tail -1) - $(jf "$tmp/B.2.json" pinned_bytes | tail -1) ))
    if [ -n "$pc" ] && [ -n "$pb" ] && [ "$pc" -lt "$pb" ] && [ $((pc - pool)) -le $(((pb - pool) / 2 + S)) ]; then
        ok; echo "dist: mode $1 pinned bytes per rank $pc vs mode $2 $pb (swap pool $pool; states $((pc - pool)) <= $((pb - pool))/2 + $S)"
    else
        bad "mode $1 pinned bytes '$pc' vs mode $2 '$pb' (swap pool $pool): want < $2's and states <= $2's/2 + $S"
    fi
done

# Mode C with REKLS (runtime/store/kinds/rekls_dist.c): every REKLS param of a split
# chunk has one owner rank that gathers its reduced gradient whole, runs the
# single-rank step and sends each rank its part of the update. Against mode B
# with REKLS (every rank steps the whole all-reduced gradient) the losses over 6
# steps and the weights --save writes must be bit-identical:
#  - CR/BR (clipped, the loop above) on 2 ranks, and on 3 ranks (parts of unequal
#    length, params cut anywhere by them);
#  - unclipped (max_grad_norm = 0) on 2 and 3 ranks;
#  - with 4 resident chunks (their REKLS params replicated on the device path,
#    the others split) on 2 and 3 ranks;
#  - with l2 decay (rekls_weight_decay_method = l2, weight_decay 0.1: the
#    weights' parts travel to the owners with the gradient) on 2 and 3 ranks,
#    whose losses must differ from the decoupled run's (the decay acts);
#  - the run exchanged bytes (its log line), and rank 0's pinned bytes are
#    mode C AdamW's plus at most the owner bound the log prints (the planner's
#    per-rank figure), and below mode B REKLS's;
#  - negative control: with the owners' updates not sent back to the other
#    ranks' parts (debug_skip_ordering = 4096) the losses differ.
# With 2 micro-batches per rank the two modes are not bit-identical: mode C
# reduces each micro-batch's gradient and adds the sums, mode B adds the
# micro-batches and reduces once (AdamW shows the same ~1e-9 relative rounding
# difference in mode C), and REKLS amplifies it (see the REKLS bound above) to
# 3.07e-4 on this script's corpus (1.16e-4 in an earlier tree; 2e-4 .. 7.1e-3
# over other texts, so the data is fixed here): checked within $cb_tol = 1e-3
# (3.3 x the measured difference). Its negative control: the same pair with the
# owners' updates not sent back (debug_skip_ordering = 4096) must differ by
# more than the bound (measured 2.99e-3, 3 x the bound).
for m in BR CR; do
    sed 's/^max_grad_norm = 0.05$/max_grad_norm = 0/' "$tmp/$m.ini" > "$tmp/${m}u.ini"
    sed 's/^n_persist = 0$/n_persist = 4/' "$tmp/$m.ini" > "$tmp/${m}p.ini"
    sed 's/^weight_decay = 0.01$/weight_decay = 0.1\nrekls_weight_decay_method = l2/' "$tmp/$m.ini" > "$tmp/${m}l.ini"
done
(cat "$tmp/CR.ini"; printf '[testing]\ndebug_skip_ordering = 4096\n') > "$tmp/CRN.ini"
rk_run() {   # $1 ranks, $2 config, $3 tag, then extra flags
    local np=$1 m=$2 tag=$3; shift 3
    (cd "$tmp" && mpirun --oversubscribe --allow-run-as-root -np $np "$sh" --config "$tmp/$m.ini" \
        "${common[@]}" --optimizer ini --metrics "$tmp/rk.$m.$tag.json" --save "$tmp/rk.$m.$tag.bin" "$@") \
        >"$tmp/rk.$m.$tag.log" 2>&1 || { tail -5 "$tmp/rk.$m.$tag.log"; bad "mode C REKLS: the run $m ($tag, $np ranks) failed"; }
}
rk_same() {   # $1 $2 run names, $3 what
    if [ -s "$tmp/$1.json" ] && [ "$(jf "$tmp/$1.json" loss)" = "$(jf "$tmp/$2.json" loss)" ] &&
       cmp -s "$tmp/$1.bin" "$tmp/$2.bin"; then
        ok; echo "dist: mode C REKLS vs mode B REKLS, $3: all 6 losses and the saved weights bit-identical"
    else
        bad "mode C REKLS vs mode B REKLS, $3: losses $(jf "$tmp/$1.json" loss | tr '\n' ' ') / $(jf "$tmp/$2.json" loss | tr '\n' ' '), weights $(cmp -s "$tmp/$1.bin" "$tmp/$2.bin" && echo same || echo differ)"
    fi
}
if [ -s "$tmp/CR.2.json" ] && [ "$(jf "$tmp/CR.2.json" loss)" = "$(jf "$tmp/BR.2.json" loss)" ] &&
   cmp -s "$tmp/CR.2.bin" "$tmp/BR.2.bin" && [ "$(jf "$tmp/CR.2.json" mode | sort -u)" = '"C"' ]; then
    ok; echo "dist: mode C REKLS vs mode B REKLS, 2 ranks, clipped: all 6 losses and the saved weights bit-identical"
else
    bad "mode C REKLS vs mode B REKLS, 2 ranks, clipped: $(jf "$tmp/CR.2.json" loss | tr '\n' ' ') / $(jf "$tmp/BR.2.json" loss | tr '\n' ' ')"
fi
for np in 3; do rk_run $np BR c$np; rk_run $np CR c$np; rk_same rk.CR.c$np rk.BR.c$np "$np ranks, clipped"; done
for np in 2 3; do
    rk_run $np BRu u$np; rk_run $np CRu u$np; rk_same rk.CRu.u$np rk.BRu.u$np "$np ranks, unclipped"
    rk_run $np BRp p$np; rk_run $np CRp p$np; rk_same rk.CRp.p$np rk.BRp.p$np "$np ranks, 4 resident chunks"
    rk_run $np BRl l$np; rk_run $np CRl l$np; rk_same rk.CRl.l$np rk.BRl.l$np "$np ranks, l2 decay"
done
[ -s "$tmp/rk.CRl.l2.json" ] && [ "$(jf "$tmp/rk.CRl.l2.json" loss)" != "$(jf "$tmp/CR.2.json" loss)" ] && ok ||
    bad "mode C REKLS with l2 decay trained exactly like decoupled decay: the l2 case is blind" 
cb_tol=1e-3
rk_run 2 BR ga --grad-accum 2; rk_run 2 CR ga --grad-accum 2; rk_run 2 CRN ga --grad-accum 2
rk_rel() {   # the largest relative loss difference of runs $1 and $2 (6 steps each)
    awk -v a="$(jf "$tmp/$1.json" loss | tr '\n' ' ')" -v b="$(jf "$tmp/$2.json" loss | tr '\n' ' ')" 'BEGIN {
        n = split(a, x, " "); m = split(b, y, " "); if (n != 6 || m != 6) { print "count " n " " m; exit }
        w = 0; for (i = 1; i <= n; i++) { e = x[i] - y[i]; if (e < 0) e = -e; if (e / x[i] > w) w = e / x[i] }
        printf "%.3g", w }'
}
d=$(rk_rel rk.CR.ga rk.BR.ga)
[ "$(jf "$tmp/rk.CR.ga.json" loss | head -1)" = "$(jf "$tmp/rk.BR.ga.json" loss | head -1)" ] &&
    awk -v r="$d" -v t="$cb_tol" 'BEGIN { exit !(r ~ /^[0-9.e+-]+$/ && r + 0 <= t + 0) }' &&
    { ok; echo "dist: mode C REKLS vs mode B REKLS, 2 ranks x 2 micro-batches: step 1 bit-identical, max relative loss difference $d (bound $cb_tol; measured 3.07e-4 on this corpus)"; } ||
    bad "mode C REKLS vs mode B REKLS with --grad-accum 2: losses differ by $d (bound $cb_tol)"
dn=$(rk_rel rk.CRN.ga rk.BR.ga)
awk -v r="$dn" -v t="$cb_tol" 'BEGIN { exit !(r ~ /^[0-9.e+-]+$/ && r + 0 > t + 0) }' &&
    { ok; echo "dist: negative control: mode C REKLS x 2 micro-batches without the owners' updates sent back: $dn, above the bound $cb_tol"; } ||
    bad "negative control: mode C REKLS x 2 micro-batches with debug_skip_ordering = 4096 differs by '$dn', not above $cb_tol: the bound is blind to it"
# the exchange ran (bytes in the log) and the pinned bytes per rank
vcr=(); for a in "${common[@]}"; do [ "$a" = --quiet ] || vcr+=("$a"); done
sed 's/^log_level = warn$/log_level = info/' "$tmp/CR.ini" > "$tmp/CRi.ini"
sed 's/^log_level = warn$/log_level = info/' "$tmp/CRN.ini" > "$tmp/CRNi.ini"
for m in CRi CRNi; do
    (cd "$tmp" && "${mpi[@]}" "$sh" --config "$tmp/$m.ini" "${vcr[@]}" --optimizer ini --metrics "$tmp/$m.json") \
        >"$tmp/$m.log" 2>&1 || { tail -5 "$tmp/$m.log"; bad "mode C REKLS: the logged run $m failed"; }
done
kib=$(sed -n 's/.*REKLS mode C: 6 steps; .*at their owners (\([0-9.]*\) KiB received).*/\1/p' "$tmp/CRi.log" | head -1)
bound=$(sed -n 's/.*this rank owns [0-9]* ([0-9]* words of state; every rank at most .* = \([0-9]*\)).*/\1/p' "$tmp/CRi.log" | head -1)
pcr=$(jf "$tmp/CR.2.json" pinned_bytes | tail -1); pc=$(jf "$tmp/C.2.json" pinned_bytes | tail -1); pbr=$(jf "$tmp/BR.2.json" pinned_bytes | tail -1)
if [ -n "$kib" ] && awk -v k="$kib" 'BEGIN { exit !(k + 0 > 0) }' && [ "$(jf "$tmp/CRi.json" loss)" = "$(jf "$tmp/CR.2.json" loss)" ]; then
    ok; grep -h "REKLS mode C: " "$tmp/CRi.log" | head -1 | sed 's/^protrain info: /dist: /'
else
    bad "mode C REKLS: the log shows no gradient bytes gathered at the owners ('$kib'), or the logged run trained otherwise"
fi
if [ -n "$bound" ] && [ -n "$pcr" ] && [ -n "$pc" ] && [ "$pcr" -gt "$pc" ] && [ $((pcr - pc)) -le $((4 * bound + 4096)) ] && [ "$pcr" -lt "$pbr" ]; then
    ok; echo "dist: mode C REKLS pinned bytes on rank 0: $pcr = mode C AdamW's $pc + $((pcr - pc)) of REKLS state (owner bound $((4 * bound)); mode B REKLS $pbr)"
else
    bad "mode C REKLS pinned bytes: $pcr vs mode C AdamW $pc, owner bound $bound words, mode B REKLS $pbr"
fi
[ -s "$tmp/CRNi.json" ] && [ "$(jf "$tmp/CRNi.json" loss)" != "$(jf "$tmp/CR.2.json" loss)" ] &&
    { ok; echo "dist: negative control: mode C REKLS without sending the owners' updates back trains otherwise (step-6 loss $(jf "$tmp/CRNi.json" loss | tail -1) vs $(jf "$tmp/CR.2.json" loss | tail -1))"; } ||
    bad "negative control: mode C REKLS with debug_skip_ordering = 4096 trained exactly like the full exchange; the check is blind"

# Resume with mode C REKLS: 2 ranks save a generation at step 6 of 12 and resume:
# steps 7-12 bit-identical to the uninterrupted run (every rank's file holds the
# whole per-parameter image, the owners' REKLS state gathered into it); the
# same generation resumed in mode B REKLS on 2 ranks: bit-identical too. Control:
# the resumed ranks ignore the restored REKLS state (debug_skip_ordering = 8192,
# the owners keep their fresh state) and the losses after step 7 differ.
rk12=("${common[@]}"); for i in "${!rk12[@]}"; do [ "${rk12[$i]}" = 6 ] && [ "${rk12[$((i-1))]}" = --steps ] && rk12[$i]=12; done
RK="$tmp/rkres"; mkdir -p "$RK"
(cat "$tmp/CR.ini"; printf '[testing]\ndebug_skip_ordering = 8192\n') > "$tmp/CRL.ini"
if (cd "$tmp" && "${mpi[@]}" "$sh" --config "$tmp/CR.ini" "${rk12[@]}" --optimizer ini --metrics "$RK/U.json") >"$RK/U.log" 2>&1 &&
   (cd "$tmp" && "${mpi[@]}" "$sh" --config "$tmp/CR.ini" "${rk12[@]}" --optimizer ini --metrics "$RK/S.json" \
        --checkpoint-dir "$RK/ck" --checkpoint-every 6 --stop-after 6) >"$RK/S.log" 2>&1; then
    for r in R RN RB; do cp -r "$RK/ck" "$RK/ck$r"; cp "$RK/S.json" "$RK/$r.json"; done
    for r in R RN RB; do
        cfg=CR; [ $r = RN ] && cfg=CRL; [ $r = RB ] && cfg=BR
        (cd "$tmp" && "${mpi[@]}" "$sh" --config "$tmp/$cfg.ini" "${rk12[@]}" --optimizer ini --metrics "$RK/$r.json" \
            --checkpoint-dir "$RK/ck$r" --resume) >"$RK/$r.log" 2>&1 || { tail -5 "$RK/$r.log"; bad "mode C REKLS: resume $r failed"; }
    done
    for r in R RB; do
        [ "$(jf "$RK/$r.json" loss)" = "$(jf "$RK/U.json" loss)" ] && [ "$(wc -l < "$RK/$r.json")" = 12 ] &&
            { ok; echo "dist: mode C REKLS saved at step 6, resumed in mode $([ $r = R ] && echo C || echo B) REKLS: all 12 losses bit-identical to the uninterrupted run"; } ||
            bad "mode C REKLS resume ($r): $(jf "$RK/$r.json" loss | tail -6 | tr '\n' ' ') vs $(jf "$RK/U.json" loss | tail -6 | tr '\n' ' ')"
    done
    [ "$(jf "$RK/RN.json" loss | sed -n 7p)" = "$(jf "$RK/U.json" loss | sed -n 7p)" ] &&
        [ "$(jf "$RK/RN.json" loss | tail -5)" != "$(jf "$RK/U.json" loss | tail -5)" ] &&
        { ok; echo "dist: negative control: resumed owners that skip the restored REKLS state train otherwise (step 12 $(jf "$RK/RN.json" loss | tail -1) vs $(jf "$RK/U.json" loss | tail -1))"; } ||
        bad "negative control: mode C REKLS resumed without taking its REKLS state matched the uninterrupted run; the check is blind"
else
    tail -5 "$RK/U.log" "$RK/S.log"; bad "mode C REKLS: the runs before the resume failed"
fi

# [osft] cache_frozen in mode C: the same bits as gathering the frozen factors
# every step (and so as mode B), with the cache in use (its log line)
cof=$(sed 's/log_level = warn/log_level = info/' "$tmp/COF.ini")
printf '%s\n' "$cof" > "$tmp/COF.ini"
vcommon=(); for a in "${common[@]}"; do [ "$a" = --quiet ] || vcommon+=("$a"); done   # logs the cache
if (cd "$tmp" && "${mpi[@]}" "$sh" --config "$tmp/COF.ini" "${vcommon[@]}" --batch 1 --seq 15 \
        --metrics "$tmp/COF.json") >"$tmp/COF.log" 2>&1 &&
   grep -q "keeps the frozen factors whole" "$tmp/COF.log" &&
   [ "$(jf "$tmp/COF.json" loss)" = "$(jf "$tmp/BO.2.json" loss)" ]; then
    ok; echo "dist: mode C + OSFT with cache_frozen: all 6 losses bit-identical to mode B + OSFT"
else
    tail -5 "$tmp/COF.log"; bad "mode C + OSFT with cache_frozen: failed, cache unused, or losses differ from BO"
fi

# Mode C with OSFT on 3 ranks (parts of unequal length, factors cut anywhere by
# them): the same losses as mode B with OSFT on 3 ranks, bit for bit.
for m in BO CO; do
    (cd "$tmp" && mpirun --oversubscribe --allow-run-as-root -np 3 "$sh" --config "$tmp/$m.ini" \
        "${common[@]}" --batch 1 --seq 15 --metrics "$tmp/${m}3.json") >"$tmp/${m}3.log" 2>&1 ||
        { tail -5 "$tmp/${m}3.log"; bad "mode $m on 3 ranks failed"; }
done
if [ -s "$tmp/CO3.json" ] && [ "$(jf "$tmp/CO3.json" mode | sort -u)" = '"C"' ] &&
   [ "$(jf "$tmp/CO3.json" loss)" = "$(jf "$tmp/BO3.json" loss)" ]; then
    ok; echo "dist: mode CO vs mode BO on 3 ranks: all 6 losses bit-identical"
else
    bad "mode CO vs BO on 3 ranks: CO $(jf "$tmp/CO3.json" loss | tr '\n' ' ') / BO $(jf "$tmp/BO3.json" loss | tr '\n' ' ')"
fi

# Mode C with OSFT keeps the factors orthogonal: after 6 steps on 2 ranks the
# factors in the saved state (every rank writes the whole image) satisfy
# U_high^T U_low = 0 and V_low V_high^T = 0 within 1e-5 relative, for every target
# (test_osft --ortho; test_osft itself shows that check failing without the
# value projection).
if (cd "$tmp" && "${mpi[@]}" "$sh" --config "$tmp/CO.ini" "${common[@]}" --batch 1 --seq 15 \
        --checkpoint-dir "$tmp/cko" --checkpoint-every 6) >"$tmp/cko.log" 2>&1 &&
   "$build/tests/test_osft" --ortho "$tmp/cko/gen-00000006/protrain_state_rank1.bin" \
        h0.qkvw h0.attprojw h0.fcw h0.fcprojw h1.qkvw h1.attprojw h1.fcw h1.fcprojw \
        >"$tmp/ortho.log" 2>&1; then
    ok; echo "dist: mode C + OSFT after 6 steps: $(grep -c '^ortho: ' "$tmp/ortho.log") targets' factors orthogonal (worst $(grep -o 'rel [0-9.e+-]*' "$tmp/ortho.log" | awk '{ if ($2 + 0 > w) w = $2 + 0 } END { print w }'), bound 1e-5)"
else
    tail -5 "$tmp/cko.log" "$tmp/ortho.log"; bad "mode C + OSFT: the checkpointed run failed or its factors are not orthogonal"
fi

# Mode C's own orderings: a chunk's all-gather waits for this rank's part to land
# in the slot, its reduce-scatter for the host's backward. Under compute jitter
# and throttled copies the losses stay bit-identical to the plain mode C run;
# with those two waits skipped ([testing] debug_skip_ordering = 512, the
# negative control) the run must go wrong (other losses, or a non-finite one).
for skip in 0 512; do
    (cat "$tmp/C.ini"; printf '[host_backend]\ncopy_bandwidth = 20 MB/s\n[testing]\ncompute_jitter = 1ms\ndebug_skip_ordering = %d\n' $skip) > "$tmp/N$skip.ini"
    (cd "$tmp" && "${mpi[@]}" "$sh" --config "$tmp/N$skip.ini" "${common[@]}" --metrics "$tmp/N$skip.json") \
        >"$tmp/N$skip.log" 2>&1
    nrc=$?
    if [ $skip = 0 ]; then
        [ $nrc = 0 ] && [ "$(jf "$tmp/N0.json" loss)" = "$(jf "$tmp/C.2.json" loss)" ] &&
            { ok; echo "dist: mode C under 1 ms compute jitter and 20 MB/s copies: losses bit-identical to the plain run"; } ||
            bad "mode C under jitter and throttled copies: rc $nrc, losses $(jf "$tmp/N0.json" loss | tr '\n' ' ')"
    else
        went_wrong N512 "$tmp/C.2.json" $nrc &&
            { ok; echo "dist: negative control: mode C without its two waits goes wrong ($why; ordered step 1: $(jf "$tmp/C.2.json" loss | head -1))"; } ||
            bad "negative control: mode C with debug_skip_ordering = 512 did not train wrong to its end ($why); the check is blind"
    fi
done

acommon=(); for a in "${common[@]}"; do [ "$a" = --quiet ] || acommon+=("$a"); done   # the plan is logged
# Gradient buckets ([dist] overlap_allreduce, on by default): each resident
# chunk's all-reduce starts as soon as the device finished its backward, while
# the rest of backward runs, and optimizer_step finishes them in layout order.
#  - mode A (every chunk resident) and PB (mode B with 4 resident block chunks):
#    losses bit-identical to the same run with every gradient reduced after
#    backward (overlap_allreduce = false): the same rank-order sums;
#  - mode A under 1 ms compute jitter (the hooks run far ahead of the device, so
#    every bucket waits for its chunk's backward): bit-identical too; with that
#    wait skipped (debug_skip_ordering = 1024, the negative control) a bucket is
#    sent before the device wrote it and the run must go wrong;
#  - mode B (every block chunk offloaded: each bucket is a chunk's fp32 sum and
#    waits for the CPU task that forms it) under jitter: bit-identical to mode B
#    without jitter; skipping that wait (1024 again) must go wrong;
#  - ranks whose plans differ (rank 0 keeps 4 block chunks resident and reduces
#    them during backward, rank 1 streams them and reduces them from its fp32
#    sums in optimizer_step): the reductions are matched by region, not by
#    order, so the losses are bit-identical to mode B with nothing resident.
base_ini "$tmp/PB.ini" 'auto_memory = false\nn_persist = 6\nn_buffer = 12\nn_swap = 0\nn_checkpoint = 0\nchunk_size = 16384'
for m in A PB; do
    (cat "$tmp/$m.ini"; printf 'overlap_allreduce = false\n') > "$tmp/${m}off.ini"
done
(cat "$tmp/A.ini"; printf '[testing]\ncompute_jitter = 1ms\n') > "$tmp/AJ.ini"
(cat "$tmp/A.ini"; printf '[testing]\ncompute_jitter = 1ms\ndebug_skip_ordering = 1024\n') > "$tmp/AJN.ini"
(cat "$tmp/B.ini"; printf '[testing]\ncompute_jitter = 1ms\n') > "$tmp/BJ.ini"
(cat "$tmp/B.ini"; printf '[testing]\ncompute_jitter = 1ms\ndebug_skip_ordering = 1024\n') > "$tmp/BJN.ini"
declare -A brc
for m in PB PBoff Aoff AJ AJN BJ BJN; do
    sed -i 's/^log_level = warn$/log_level = info/' "$tmp/$m.ini"
    (cd "$tmp" && "${mpi[@]}" "$sh" --config "$tmp/$m.ini" "${acommon[@]}" --metrics "$tmp/$m.json") \
        >"$tmp/$m.log" 2>&1
    brc[$m]=$?
    # the controls (..JN) are judged below by went_wrong
    [ ${brc[$m]} = 0 ] || [ ${m:2:1} = N ] || { tail -5 "$tmp/$m.log"; bad "buckets: the 2-rank run $m failed"; }
done
for pair in "Aoff A.2" "PBoff PB" "AJ A.2" "BJ B.2"; do
    set -- $pair
    [ -s "$tmp/$2.json" ] && [ "$(jf "$tmp/$1.json" loss)" = "$(jf "$tmp/$2.json" loss)" ] &&
        { ok; echo "dist: buckets: $2 (overlapped) vs $1: all 6 losses bit-identical"; } ||
        bad "buckets: $2 vs $1 losses differ: $(jf "$tmp/$2.json" loss | tr '\n' ' ') / $(jf "$tmp/$1.json" loss | tr '\n' ' ')"
done
# the overlapped runs did take the bucket path (the plugin says how many chunks)
for m in PB AJ BJ; do
    grep -q "gradient all-reduce: [1-9][0-9]* chunk(s) reduced in buckets" "$tmp/$m.log" && ok ||
        bad "buckets: run $m did not report its gradient buckets"
    [ $m = BJ ] || ! grep -q "gradient all-reduce: .* in buckets" "$tmp/${m%J}off.log" ||
        bad "buckets: the overlap_allreduce = false run ${m%J}off reduced in buckets"
done
grep -h "gradient all-reduce" "$tmp/PB.log" | head -1 | sed 's/^protrain info: /dist: PB: /'
for m in A B; do
    went_wrong ${m}JN "$tmp/$m.2.json" ${brc[${m}JN]} &&
        { ok; echo "dist: negative control: mode $m's buckets sent without waiting for their gradient go wrong ($why; ordered step 6: $(jf "$tmp/$m.2.json" loss | tail -1))"; } ||
        bad "negative control: mode $m with debug_skip_ordering = 1024 did not train wrong to its end ($why); the check is blind"
done
# with 2 micro-batches per step on each rank (buckets only at the last one)
for m in PB PBoff; do
    (cd "$tmp" && "${mpi[@]}" "$sh" --config "$tmp/$m.ini" "${common[@]}" --grad-accum 2 --steps 4 \
        --metrics "$tmp/${m}2.json") >"$tmp/${m}2.log" 2>&1 || { tail -5 "$tmp/${m}2.log"; bad "buckets: $m with --grad-accum 2 failed"; }
done
[ -s "$tmp/PB2.json" ] && [ "$(jf "$tmp/PB2.json" loss)" = "$(jf "$tmp/PBoff2.json" loss)" ] &&
    { ok; echo "dist: buckets: PB with --grad-accum 2 on each rank: losses bit-identical to reducing after backward"; } ||
    bad "buckets: PB with --grad-accum 2: $(jf "$tmp/PB2.json" loss | tr '\n' ' ') vs $(jf "$tmp/PBoff2.json" loss | tr '\n' ' ')"
# MPMD: one rank per config
(cd "$tmp" && mpirun --oversubscribe --allow-run-as-root -np 1 "$sh" --config "$tmp/PB.ini" "${common[@]}" \
    --metrics "$tmp/PBmix.json" : -np 1 "$sh" --config "$tmp/B.ini" "${common[@]}") >"$tmp/PBmix.log" 2>&1
[ -s "$tmp/PBmix.json" ] && [ "$(jf "$tmp/PBmix.json" loss)" = "$(jf "$tmp/B.2.json" loss)" ] &&
    { ok; echo "dist: buckets: ranks with different resident chunks (rank 0 four, rank 1 none): losses bit-identical to mode B"; } ||
    { tail -5 "$tmp/PBmix.log"; bad "buckets: ranks with different plans: losses $(jf "$tmp/PBmix.json" loss | tr '\n' ' ') vs mode B $(jf "$tmp/B.2.json" loss | tr '\n' ' ')"; }

# auto_mode with 2 ranks (zero3_shard = auto): A when the model fits the device;
# B when it does not and the replicated offloaded state fits the pinned budget
# (the plan says why, with the bytes per rank); a budget nothing fits fails
# with the pinned bytes per rank of mode C and of mode B.
# B and the failure fix n_persist (a knob still overrides auto_mode's "A when it
# fits"): on this small model every chunk fits the default device.
auto_ini() {   # $1 file, $2 pinned_budget line, $3 [protrain] line
    printf '[plugin]\nbackend = host\nlog_level = info\n[memory]\n%b\n[protrain]\nchunk_size = 16384\n%b\n' "$2" "$3" > "$1"
    printf '[optimizer]\ncpu_threads = 1\n[dist]\ntimeout = 20\n' >> "$1"
}
auto_ini "$tmp/autoA.ini" '' ''
auto_ini "$tmp/autoB.ini" 'pinned_budget = 1 MiB' 'n_persist = 2'
auto_ini "$tmp/autoX.ini" 'pinned_budget = 50 KiB' 'n_persist = 0'
for m in A B; do
    if (cd "$tmp" && "${mpi[@]}" "$sh" --config "$tmp/auto$m.ini" "${acommon[@]}" --steps 2 \
            --metrics "$tmp/auto$m.json") >"$tmp/auto$m.log" 2>&1; then
        [ "$(jf "$tmp/auto$m.json" mode | sort -u)" = "\"$m\"" ] && ok ||
            bad "auto_mode: ran mode $(jf "$tmp/auto$m.json" mode | sort -u), want $m"
        grep -q "auto_mode: $m, " "$tmp/auto$m.log" && ok ||
            { grep -A1 "execution mode" "$tmp/auto$m.log"; bad "auto_mode: the plan does not say why mode $m"; }
    else
        tail -5 "$tmp/auto$m.log"; bad "auto_mode: the run expected to pick mode $m failed"
    fi
done
grep -h "auto_mode: B, " "$tmp/autoB.log" | head -1 | sed 's/^.*auto_mode/dist: auto_mode/'
# auto_mode picks C with OSFT too when only the split state fits the budget
auto_ini "$tmp/autoCO.ini" 'pinned_budget = 300 KiB' 'n_persist = 0'
printf "$osft" >> "$tmp/autoCO.ini"
if (cd "$tmp" && "${mpi[@]}" "$sh" --config "$tmp/autoCO.ini" "${acommon[@]}" --batch 1 --seq 15 \
        --steps 2 --metrics "$tmp/autoCO.json") >"$tmp/autoCO.log" 2>&1 &&
   [ "$(jf "$tmp/autoCO.json" mode | sort -u)" = '"C"' ] && grep -q "auto_mode: C, " "$tmp/autoCO.log"; then
    ok; echo "dist: auto_mode with OSFT and a 300 KiB pinned budget: mode C"
else
    tail -5 "$tmp/autoCO.log"; bad "auto_mode with OSFT: did not run mode C under a 300 KiB pinned budget"
fi
if (cd "$tmp" && "${mpi[@]}" "$sh" --config "$tmp/autoX.ini" "${acommon[@]}" --steps 2) \
        >"$tmp/autoX.log" 2>&1; then
    bad "auto_mode: a 50 KiB pinned budget trained anyway"
else
    n=$(grep -c "rank [01]: error: .*need [0-9]* bytes (this rank's parts in mode C, split over 2 ranks; replicated on every rank, mode B, they would need [0-9]*)" "$tmp/autoX.log")
    # both ranks fail alike, but mpirun may end the second before it prints
    [ "$n" -ge 1 ] && ok || { tail -4 "$tmp/autoX.log"; bad "auto_mode: with nothing fitting, no rank named the bytes of modes B and C"; }
fi

# auto_mode choosing C: a model with 8 blocks (0.42 M fp32 parameters: about
# 8 MB of offloaded state replicated, half that split over 2 ranks), chunks
# offloaded (n_persist = 0 fixed, so B must hold every chunk's state). At a
# 6 MiB pinned budget mode B does not fit and C does: the run trains in C, the
# plan names both modes' bytes per rank (B's above the budget, C's within it),
# and this rank's measured pinned bytes are C's prediction (within one chunk).
# At 16 MiB the same model picks B, and trains to the same losses bit for bit.
big=(--layers 8 --heads 2 --channels 64)
auto_ini "$tmp/autoC.ini" 'pinned_budget = 6 MiB' 'n_persist = 0\nchunk_size = 65536'
auto_ini "$tmp/autoC16.ini" 'pinned_budget = 16 MiB' 'n_persist = 0\nchunk_size = 65536'
sed -i '/^chunk_size = 16384$/d' "$tmp/autoC.ini" "$tmp/autoC16.ini"
if (cd "$tmp" && "${mpi[@]}" "$sh" --config "$tmp/autoC.ini" "${acommon[@]}" "${big[@]}" --steps 2 \
        --metrics "$tmp/autoC.json") >"$tmp/autoC.log" 2>&1 &&
   (cd "$tmp" && "${mpi[@]}" "$sh" --config "$tmp/autoC16.ini" "${acommon[@]}" "${big[@]}" --steps 2 \
        --metrics "$tmp/autoC16.json") >"$tmp/autoC16.log" 2>&1; then
    why=$(grep -h "auto_mode: C, " "$tmp/autoC.log" | tail -1)
    rep=$(echo "$why" | sed -n 's/.*would need \([0-9]*\) pinned bytes per rank, over the budget of \([0-9]*\); split across 2 ranks it needs \([0-9]*\).*/\1/p')
    bud=$(echo "$why" | sed -n 's/.*over the budget of \([0-9]*\);.*/\1/p')
    shd=$(echo "$why" | sed -n 's/.*split across 2 ranks it needs \([0-9]*\).*/\1/p')
    pin=$(jf "$tmp/autoC.json" pinned_bytes | tail -1)
    [ "$(jf "$tmp/autoC.json" mode | sort -u)" = '"C"' ] && [ -n "$rep" ] && [ -n "$shd" ] && [ -n "$pin" ] &&
        [ "$rep" -gt "$bud" ] && [ "$shd" -le "$bud" ] && [ "$bud" = 6291456 ] &&
        [ $((pin - shd)) -le 65536 ] && [ $((shd - pin)) -le 65536 ] && [ "$pin" -le "$bud" ] &&
        { ok; echo "dist: auto_mode: C at a 6 MiB budget: B would need $rep pinned bytes per rank, C $shd (measured $pin)"; } ||
        { echo "$why"; bad "auto_mode: C expected: mode $(jf "$tmp/autoC.json" mode | sort -u), B $rep / C $shd / budget $bud / measured $pin"; }
    [ "$(jf "$tmp/autoC16.json" mode | sort -u)" = '"B"' ] && grep -q "auto_mode: B, " "$tmp/autoC16.log" && ok ||
        bad "auto_mode: at 16 MiB the 8-block model ran mode $(jf "$tmp/autoC16.json" mode | sort -u), want B"
    [ "$(jf "$tmp/autoC.json" loss)" = "$(jf "$tmp/autoC16.json" loss)" ] && ok ||
        bad "auto_mode: the mode C run's losses differ from the mode B run's"
else
    tail -5 "$tmp/autoC.log" "$tmp/autoC16.log"; bad "auto_mode: the 8-block runs at 6 / 16 MiB failed"
fi

# auto_mode with REKLS: the same 8-block model under REKLS (about 12 MB of
# factors replicated). Mode B would pin 20 MB per rank; mode C splits the chunks'
# parts over the ranks and keeps each REKLS param's state at one owner, which the
# planner charges as the owner bound (ceil(T / W) + w_max words per rank). At a
# 16 MiB budget auto_mode must pick C, this rank's measured pinned bytes must not
# exceed C's prediction (the bound is an upper bound), and at 40 MiB it picks B
# and trains to the same losses bit for bit.
for b in 16 40; do
    auto_ini "$tmp/autoR$b.ini" "pinned_budget = $b MiB" 'n_persist = 0\nchunk_size = 65536'
    sed -i '/^chunk_size = 16384$/d; s/^cpu_threads = 1$/cpu_threads = 1\ntype = rekls\nbeta2 = 0.95\nweight_decay = 0.01\nmax_grad_norm = 0.05\nlr = 1e-3/' "$tmp/autoR$b.ini"
    (cd "$tmp" && "${mpi[@]}" "$sh" --config "$tmp/autoR$b.ini" "${acommon[@]}" "${big[@]}" --steps 2 \
        --optimizer ini --metrics "$tmp/autoR$b.json") >"$tmp/autoR$b.log" 2>&1 ||
        { tail -5 "$tmp/autoR$b.log"; bad "auto_mode with REKLS at $b MiB failed"; }
done
why=$(grep -h "auto_mode: C, " "$tmp/autoR16.log" | tail -1)
shd=$(echo "$why" | sed -n 's/.*split across 2 ranks it needs \([0-9]*\).*/\1/p')
pin=$(jf "$tmp/autoR16.json" pinned_bytes | tail -1)
[ "$(jf "$tmp/autoR16.json" mode | sort -u)" = '"C"' ] && [ -n "$shd" ] && [ -n "$pin" ] && [ "$pin" -le "$shd" ] &&
    [ "$shd" -le 16777216 ] && grep -q "moving REKLS gradients to their owner ranks" "$tmp/autoR16.log" &&
    { ok; echo "dist: auto_mode with REKLS at 16 MiB: mode C, predicted $shd pinned bytes per rank (owner bound included), measured $pin"; } ||
    { echo "$why"; bad "auto_mode with REKLS at 16 MiB: mode $(jf "$tmp/autoR16.json" mode | sort -u), predicted '$shd', measured '$pin'"; }
[ "$(jf "$tmp/autoR40.json" mode | sort -u)" = '"B"' ] && [ -s "$tmp/autoR16.json" ] &&
    [ "$(jf "$tmp/autoR16.json" loss)" = "$(jf "$tmp/autoR40.json" loss)" ] &&
    { ok; echo "dist: auto_mode with REKLS at 40 MiB: mode B, the same losses as the mode C run"; } ||
    bad "auto_mode with REKLS at 40 MiB: mode $(jf "$tmp/autoR40.json" mode | sort -u), losses $(jf "$tmp/autoR40.json" loss | tr '\n' ' ') vs C $(jf "$tmp/autoR16.json" loss | tr '\n' ' ')"

# Profile cache across ranks: every rank plans from its cache or every rank
# profiles (profiling runs collectives). Two ranks with their own cache folders
# fill them (run 1), then both hit (run 2: no profiling step); then rank 1 gets
# an empty folder (run 3): rank 0 hits, learns that a rank missed, and both
# profile and train (before ranks agreed, rank 0 went on to train while rank 1
# profiled, and both stopped at the collective timeout).
mkdir -p "$tmp/pc0" "$tmp/pc1" "$tmp/pcE"
for r in 0 1 E; do auto_ini "$tmp/pc$r.ini" '' "cache_dir = $tmp/pc$r"; done
pcrun() {   # $1 run name, $2 / $3 the configs of rank 0 / rank 1
    (cd "$tmp" && timeout 120 mpirun --oversubscribe --allow-run-as-root -np 1 "$sh" --config "$2" "${acommon[@]}" \
        --steps 2 --metrics "$tmp/$1.json" : -np 1 "$sh" --config "$3" "${acommon[@]}" --steps 2) \
        >"$tmp/$1.log" 2>&1
}
if pcrun pcfill "$tmp/pc0.ini" "$tmp/pc1.ini" && pcrun pchit "$tmp/pc0.ini" "$tmp/pc1.ini"; then
    # (info lines come from rank 0 only: it hit, and no rank missed)
    grep -q "profile cache: hit /" "$tmp/pchit.log" && ! grep -q "missed" "$tmp/pchit.log" && ok ||
        { grep "profile cache" "$tmp/pchit.log"; bad "profile cache: with both caches filled, not both ranks hit"; }
    if pcrun pcmix "$tmp/pc0.ini" "$tmp/pcE.ini"; then
        grep -q "profile cache: hit here, but 1 of 2 rank(s) missed; every rank profiles" "$tmp/pcmix.log" &&
            [ "$(grep -c "profile cache: hit /" "$tmp/pcmix.log")" = 0 ] && [ "$(wc -l < "$tmp/pcmix.json")" = 2 ] &&
            [ -n "$(ls "$tmp/pcE")" ] &&
            { ok; echo "dist: profile cache: rank 0 hit, rank 1's folder was empty: both profiled and trained (rank 1's cache filled)"; } ||
            { grep "profile cache" "$tmp/pcmix.log"; bad "profile cache: with one rank's cache empty the ranks did not both profile"; }
    else
        tail -5 "$tmp/pcmix.log"; bad "profile cache: one rank hit and one missed, and the run failed or hung"
    fi
else
    tail -5 "$tmp/pcfill.log" "$tmp/pchit.log"; bad "profile cache: the 2-rank runs with caches failed"
fi

# Resume across ranks and modes: 2 ranks in mode C save a generation at step 10
# of 20 (--stop-after 10); it is resumed (a) by 1 rank with --grad-accum 2 in
# mode B and (b) by 2 ranks in mode B. Steps 11-20 must continue the losses of
# the uninterrupted 2-rank mode C run: (b) bit-identical (mode B and C compute
# the same bits), (a) step 11 bit-identical and within 1e-6 relative after (the
# accumulation order of 1 rank, as above). And (c): a generation saved by 1 rank
# (mode B) resumes on 2 ranks in mode C (rank 1 reads rank 0's state file),
# against the uninterrupted 1-rank run, within 1e-6.
rc20=("${common[@]}"); for i in "${!rc20[@]}"; do [ "${rc20[$i]}" = 6 ] && [ "${rc20[$((i-1))]}" = --steps ] && rc20[$i]=20; done
rel() {   # max relative difference of the losses of steps $3.. in files $1 and $2
    awk -v a="$(jf "$1" loss | tail -n +"$3" | tr '\n' ' ')" -v b="$(jf "$2" loss | tail -n +"$3" | tr '\n' ' ')" 'BEGIN {
        n = split(a, x, " "); m = split(b, y, " "); if (n != m || n == 0) { print "count " n " " m; exit }
        w = 0; for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < 0) d = -d; if (d / x[i] > w) w = d / x[i] }
        printf "%.3g", w }'
}
R="$tmp/resume"; mkdir -p "$R"
if (cd "$tmp" && "${mpi[@]}" "$sh" --config "$tmp/C.ini" "${rc20[@]}" --metrics "$R/U.json") >"$R/U.log" 2>&1 &&
   (cd "$tmp" && "${mpi[@]}" "$sh" --config "$tmp/C.ini" "${rc20[@]}" --metrics "$R/S.json" \
        --checkpoint-dir "$R/ck" --checkpoint-every 10 --stop-after 10) >"$R/S.log" 2>&1; then
    [ -f "$R/ck/gen-00000010/protrain_state_rank0.bin" ] && [ -f "$R/ck/gen-00000010/protrain_state_rank1.bin" ] && ok ||
        bad "resume: the generation lacks a rank's state file: $(ls "$R/ck/gen-00000010" | tr '\n' ' ')"
    cp -r "$R/ck" "$R/ck1"; cp "$R/S.json" "$R/R1.json"; cp -r "$R/ck" "$R/ck2"; cp "$R/S.json" "$R/R2.json"
    if "$sh" --config "$tmp/B.ini" "${rc20[@]}" --grad-accum 2 --metrics "$R/R1.json" \
            --checkpoint-dir "$R/ck1" --resume >"$R/R1.log" 2>&1; then
        d=$(rel "$R/U.json" "$R/R1.json" 11)
        [ "$(jf "$R/U.json" loss | sed -n 11p)" = "$(jf "$R/R1.json" loss | sed -n 11p)" ] &&
            awk -v r="$d" 'BEGIN { exit !(r ~ /^[0-9.e+-]+$/ && r + 0 <= 1e-6) }' &&
            { ok; echo "dist: resume 2 ranks mode C -> 1 rank mode B x grad-accum 2 at step 10: step 11 bit-identical, steps 11-20 within $d"; } ||
            bad "resume C(2) -> B(1): steps 11-20 differ by $d from the uninterrupted run"
    else
        tail -5 "$R/R1.log"; bad "resume C(2) -> B(1) failed"
    fi
    if (cd "$tmp" && "${mpi[@]}" "$sh" --config "$tmp/B.ini" "${rc20[@]}" --metrics "$R/R2.json" \
            --checkpoint-dir "$R/ck2" --resume) >"$R/R2.log" 2>&1; then
        [ "$(jf "$R/U.json" loss)" = "$(jf "$R/R2.json" loss)" ] && [ "$(wc -l < "$R/R2.json")" = 20 ] &&
            { ok; echo "dist: resume 2 ranks mode C -> 2 ranks mode B at step 10: all 20 losses bit-identical to the uninterrupted run"; } ||
            bad "resume C(2) -> B(2): losses differ: $(rel "$R/U.json" "$R/R2.json" 11)"
    else
        tail -5 "$R/R2.log"; bad "resume C(2) -> B(2) failed"
    fi
else
    tail -5 "$R/U.log" "$R/S.log"; bad "resume: the 2-rank mode C runs failed"
fi
if "$sh" --config "$tmp/B.ini" "${rc20[@]}" --grad-accum 2 --metrics "$R/U1.json" >"$R/U1.log" 2>&1 &&
   "$sh" --config "$tmp/B.ini" "${rc20[@]}" --grad-accum 2 --metrics "$R/S1.json" \
        --checkpoint-dir "$R/ck3" --checkpoint-every 10 --stop-after 10 >"$R/S1.log" 2>&1 &&
   (cd "$tmp" && "${mpi[@]}" "$sh" --config "$tmp/C.ini" "${rc20[@]}" --metrics "$R/S1.json" \
        --checkpoint-dir "$R/ck3" --resume) >"$R/R3.log" 2>&1; then
    d=$(rel "$R/U1.json" "$R/S1.json" 11)
    [ "$(jf "$R/S1.json" mode | tail -1)" = '"C"' ] && awk -v r="$d" 'BEGIN { exit !(r ~ /^[0-9.e+-]+$/ && r + 0 <= 1e-6) }' &&
        { ok; echo "dist: resume 1 rank mode B -> 2 ranks mode C at step 10: steps 11-20 within $d of the uninterrupted 1-rank run"; } ||
        bad "resume B(1) -> C(2): mode $(jf "$R/S1.json" mode | tail -1), steps 11-20 differ by $d"
else
    tail -5 "$R/R3.log"; bad "resume B(1) -> C(2) failed"
fi

# Control: the step-1 equality above is not trivial: one rank on its own batch
# (no accumulation) reports another loss, so a wrong batch split would show.
if "$sh" --config "$tmp/A.ini" "${common[@]}" --steps 1 --grad-accum 1 --metrics "$tmp/c.json" \
        >"$tmp/c.log" 2>&1; then
    [ "$(jf "$tmp/c.json" loss)" != "$(jf "$tmp/A.2.json" loss | head -1)" ] && ok ||
        bad "control: 1 rank on batch 0 alone gives the 2-rank step-1 loss; the check is blind"
else
    cat "$tmp/c.log"; bad "control: the 1-rank --grad-accum 1 run failed"
fi

# A hung rank: the other names it and exits non-zero within the timeout (+ start-up).
(sed 's/^timeout = 20/timeout = 2/' "$tmp/A.ini"; printf '[testing]\ndebug_hang_rank = 1\n') > "$tmp/hang.ini"
t0=$(date +%s)
(cd "$tmp" && timeout 60 "${mpi[@]}" "$sh" --config "$tmp/hang.ini" "${common[@]}") \
    >"$tmp/hang.log" 2>&1
rc=$?; dt=$(( $(date +%s) - t0 ))
[ $rc != 0 ] && [ $rc != 124 ] && ok || bad "hung rank: mpirun exited $rc (want non-zero, not the 60 s guard)"
[ $dt -le 20 ] && ok || bad "hung rank: took $dt s to fail (timeout 2 s)"
grep -q "rank 0: error: .*rank 1 did not send its part within \[dist\] timeout = 2 s" "$tmp/hang.log" && ok ||
    { tail -15 "$tmp/hang.log"; bad "hung rank: rank 0's error does not name rank 1 and the timeout"; }

# A killed rank (SIGKILL, mid-run): the job ends non-zero, well within the guard.
# Rank 1 is found among this run's processes by the rank mpirun put in its
# environment.
(cd "$tmp" && exec timeout 60 "${mpi[@]}" "$sh" --config "$tmp/A.ini" "${common[@]}" --steps 100000) \
    >"$tmp/kill.log" 2>&1 &
job=$!
t0=$(date +%s); r1=""
for w in $(seq 1 400); do
    for d in /proc/[0-9]*; do
        [ "$(readlink "$d/exe" 2>/dev/null)" = "$(readlink -f "$sh")" ] || continue
        tr '\0' '\n' < "$d/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && r1=${d#/proc/}
    done
    [ -n "$r1" ] && break
    sleep 0.05
done
if [ -z "$r1" ]; then
    kill "$job" 2>/dev/null; wait "$job"; bad "killed rank: rank 1's process was not found"
else
    sleep 0.5   # let it get into training
    kill -9 "$r1"
    wait "$job"; rc=$?; dt=$(( $(date +%s) - t0 ))
    [ $rc != 0 ] && [ $rc != 124 ] && ok || bad "killed rank: mpirun exited $rc (want non-zero, not the 60 s guard)"
    [ $dt -le 30 ] && ok || bad "killed rank: the job took $dt s to end"
fi

echo "dist: $pass passed, $fail failed"
exit $fail
