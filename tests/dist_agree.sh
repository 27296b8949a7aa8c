#!/usr/bin/env bash
# Ranks that disagree must refuse to train together, on every rank, with a
# sentence naming the first differing field (runtime/core/dist_agree.h), and a
# world size that MPI does not confirm must be a sentence, not an abort inside
# MPI (gpu/mpi/coll_mpi.c). Two ranks under mpirun, rank 1 started with one
# setting changed:
#   --seed, --lr, --batch, --grad-accum, --data, --layers, --heads (the same
#   parameter shapes),
#   --warmup, --lr-schedule, --data-order, --val-every, --temperature,
#   --checkpoint-dir, --checkpoint-every, --stop-after (the host's fingerprint,
#   at init);
#   [protrain] zero3_shard on one rank only (mode C against mode B, at init);
#   --load of another checkpoint (the initial weights, at post_model_load);
#   [optimizer] beta1 with --optimizer ini (the optimizer, at create_optimizer);
#   [optimizer] beta2 = 0.95 against auto (0.999 for AdamW: refused as resolved),
#   while beta2 = 0.999 and weight_decay = 0 against auto train (the same math);
#   through a hook-level host (tests/integ/test_agree_hooks.c): a parameter's
#   name or dtype, one initial value, n_micro at the first pre_step, a
#   fingerprint line;
# and, the same on both ranks, [dist] tp_size = 2 with a host that splits no
# parameter (refused at post_model_load: nothing would be averaged). Each must
# exit non-zero on BOTH ranks, each rank printing the field. A clean pair must
# still train (exit 0, metrics written). World size: rank 1 told it is one of 3
# while mpirun starts 2, and one process told it is one of 2 without mpirun:
# the sample host's error exit (1) with the sentence, no MPI error text; and
# both processes of a 2-process mpirun told they are rank 0 of 1 (refused, no
# metrics written).
set -u
root="${PT_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}"
build="${PT_BUILD:-$root/build}"
if ! command -v mpirun >/dev/null 2>&1; then
    # the plugin links MPI, so a machine that built it without mpirun lacks a
    # dependency: nothing here ran, which must not read as a pass
    echo "dist_agree: FAIL: mpirun is not installed, so no rank ran (make deps installs openmpi-bin)"; exit 1
fi
if [ -n "${PT_SAN:-}" ]; then
    export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
    export TSAN_OPTIONS="${TSAN_OPTIONS:-} suppressions=$(cd "$(dirname "$0")" && pwd)/tsan_openmpi.supp"
fi
fail=0; pass=0
bad() { echo "dist_agree: FAIL: $*"; fail=1; }
tmp=$(mktemp -d /tmp/test_dist_agree.XXXXXX)
trap '[ -n "${PT_KEEP:-}" ] || rm -rf "$tmp"' EXIT
sh="$build/sample_host"; plug="$build/protrain_plugin.so"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
# the job goes on when one rank exits non-zero, so each rank's own status is seen
mpi=(mpirun --oversubscribe --allow-run-as-root --mca orte_abort_on_non_zero_status 0)
common=(--layers 2 --heads 2 --channels 32 --vocab 256 --seq 16 --batch 2 --steps 2
        --lr 1e-3 --val-every 0 --gen-every 0 --quiet --progress off --plugin "$plug")

ini() {   # $1 = file, $2 = extra lines
    printf '[plugin]\nbackend = host\nlog_level = warn\n[protrain]\nauto_mode = false\n' > "$1"
    printf 'force_all_persistent = true\n[optimizer]\ncpu_threads = 1\n[dist]\ntimeout = 20\n' >> "$1"
    printf '%b' "$2" >> "$1"
}
ini "$tmp/A.ini" ''
ini "$tmp/TP.ini" 'tp_size = 2\n'
sed 's/^cpu_threads = 1$/cpu_threads = 1\nbeta1 = 0.8/' "$tmp/A.ini" > "$tmp/B1.ini"
sed 's/^cpu_threads = 1$/cpu_threads = 1\nbeta2 = 0.95/' "$tmp/A.ini" > "$tmp/B2.ini"
sed 's/^cpu_threads = 1$/cpu_threads = 1\nbeta2 = 0.999\nweight_decay = 0/' "$tmp/A.ini" > "$tmp/B2E.ini"
# modes B and C: streamed chunks, rank 1 alone shards them
for m in B C; do
    printf '[plugin]\nbackend = host\nlog_level = warn\n[protrain]\nauto_mode = false\n' > "$tmp/$m.ini"
    printf 'auto_memory = false\nn_persist = 0\nn_buffer = 12\nn_swap = 0\nn_checkpoint = 0\n' >> "$tmp/$m.ini"
    [ $m = C ] && printf 'zero3_shard = on\n' >> "$tmp/$m.ini"
    printf 'chunk_size = 16384\n[optimizer]\ncpu_threads = 1\n[dist]\ntimeout = 20\n' >> "$tmp/$m.ini"
done
head -c 6000 "$root/README.md" > "$tmp/other.txt"

# run2 NAME "rank 0 args" "rank 1 args": each rank's exit status in NAME.rc0 / NAME.rc1
run2() {
    local n=$1
    timeout 120 "${mpi[@]}" \
        -np 1 bash -c '"$@"; echo $? > '"$tmp/$n.rc0" _ "$sh" "${common[@]}" $2 : \
        -np 1 bash -c '"$@"; echo $? > '"$tmp/$n.rc1" _ "$sh" "${common[@]}" $3 \
        > "$tmp/$n.out" 2>&1
}

# refuse NAME PATTERN "rank 0 args" "rank 1 args"
refuse() {
    local n=$1 pat=$2
    run2 "$n" "$3" "$4"
    for r in 0 1; do
        local rc; rc=$(cat "$tmp/$n.rc$r" 2>/dev/null || echo missing)
        if [ "$rc" = 0 ] || [ "$rc" = missing ]; then
            bad "$n: rank $r exit status $rc, want non-zero"; sed 's/^/    /' "$tmp/$n.out" | head -20
        elif ! grep -q "rank $r: error: .*$pat" "$tmp/$n.out"; then
            bad "$n: rank $r did not name '$pat':"; sed 's/^/    /' "$tmp/$n.out" | head -20
        else
            pass=$((pass + 1))
        fi
    done
}

# a clean pair trains: exit 0 on both ranks, metrics for both steps
run2 clean "--config $tmp/A.ini --metrics $tmp/clean.jsonl" "--config $tmp/A.ini"
if [ "$(cat "$tmp/clean.rc0" 2>/dev/null)" != 0 ] || [ "$(cat "$tmp/clean.rc1" 2>/dev/null)" != 0 ]; then
    bad "clean: two agreeing ranks did not train:"; sed 's/^/    /' "$tmp/clean.out" | head -20
elif [ "$(grep -c '"step"' "$tmp/clean.jsonl" 2>/dev/null)" -lt 2 ]; then
    bad "clean: metrics of 2 steps missing"
else
    pass=$((pass + 1))
fi

a="--config $tmp/A.ini"
refuse seed 'disagrees with rank 0 on host.run.seed: 99 vs 1337' "$a" "$a --seed 99"
refuse lr 'disagrees with rank 0 on host.lr: 0.5 vs 0.001' "$a" "$a --lr 0.5"
refuse batch 'disagrees with rank 0 on host.run.batch: 3 vs 2' "$a" "$a --batch 3"
refuse accum 'disagrees with rank 0 on host.run.micro_batches_per_step: 4 vs 2' "$a" "$a --grad-accum 2"
refuse data 'disagrees with rank 0 on host.run.data.train_' "$a" "$a --data $tmp/other.txt"
# settings whose parameters have the same shapes, or that change only when the
# ranks meet (evaluation, samples, checkpoints): each one differing on rank 1
# alone is refused at init, named (sample_host/sh_fingerprint.h lists them all)
refuse heads 'disagrees with rank 0 on host.run.heads: 4 vs 2' "$a" "$a --heads 4"
refuse warmup 'disagrees with rank 0 on host.run.warmup: 5 vs 0' "$a --warmup 0" "$a --warmup 5"
refuse schedule 'disagrees with rank 0 on host.run.lr_schedule: linear vs cosine' \
    "$a" "$a --lr-schedule linear"
refuse order 'disagrees with rank 0 on host.run.data_order: shuffled vs random' \
    "$a" "$a --data-order shuffled"
refuse val_every 'disagrees with rank 0 on host.val_every: 1 vs 0' "$a" "$a --val-every 1"
refuse temperature 'disagrees with rank 0 on host.temperature: 0 vs 0.800000012' "$a" "$a --temperature 0"
refuse ckdir "disagrees with rank 0 on host.checkpoint_dir: $tmp/ck1 vs $tmp/ck0" \
    "$a --checkpoint-dir $tmp/ck0" "$a --checkpoint-dir $tmp/ck1"
refuse ckevery 'disagrees with rank 0 on host.checkpoint_every: 1 vs 0' \
    "$a --checkpoint-dir $tmp/ck2" "$a --checkpoint-dir $tmp/ck2 --checkpoint-every 1"
refuse stop 'disagrees with rank 0 on host.stop_after: 1 vs 0' \
    "$a --checkpoint-dir $tmp/ck3" "$a --checkpoint-dir $tmp/ck3 --stop-after 1"
refuse mode 'disagrees with rank 0 on protrain.zero3_shard: on vs auto' \
    "--config $tmp/B.ini" "--config $tmp/C.ini"
refuse layers 'disagrees with rank 0 on host.run.layers: 3 vs 2' "$a" "$a --layers 3"
refuse beta1 'disagrees with rank 0 on optimizer.beta1: 0.800000012 vs 0.899999976' \
    "$a --optimizer ini" "--config $tmp/B1.ini --optimizer ini"
refuse beta2 'disagrees with rank 0 on optimizer.beta2 (as resolved: auto is 0.95 for rekls, 0.999 for adamw): 0.949999988 vs 0.999000013' \
    "$a --optimizer ini" "--config $tmp/B2.ini --optimizer ini"
refuse tp 'tp_size = 2, but no parameter is split' "--config $tmp/TP.ini" "--config $tmp/TP.ini"

# "auto" on one rank and the number it resolves to on the other: the same math, trains
run2 auto "$a --optimizer ini" "--config $tmp/B2E.ini --optimizer ini"
if [ "$(cat "$tmp/auto.rc0" 2>/dev/null)" != 0 ] || [ "$(cat "$tmp/auto.rc1" 2>/dev/null)" != 0 ]; then
    bad "auto: beta2/weight_decay auto vs 0.999/0 did not train:"; sed 's/^/    /' "$tmp/auto.out" | head -20
else
    pass=$((pass + 1))
fi

# the same fingerprint, other initial weights: each rank loads another checkpoint
for s in 1 2; do
    "$sh" "${common[@]}" --no-plugin --steps 1 --seed $s --save "$tmp/w$s.bin" > "$tmp/w$s.out" 2>&1 ||
        bad "writing checkpoint w$s: $(tail -2 "$tmp/w$s.out")"
done
refuse weights 'disagrees with rank 0 on model.param\[0\] wte initial values' \
    "$a --load $tmp/w1.bin" "$a --load $tmp/w2.bin"

# the facts sample_host cannot vary alone, through a hook-level host
# (tests/integ/test_agree_hooks.c): a parameter's name or dtype, n_micro, a
# fingerprint line; and a clean pair of hosts without a fingerprint trains
hooks="$build/tests/test_agree_hooks"
ini "$tmp/H.ini" ''
hooks2() {   # $1 case: each rank's status in hooks_$1.rc0 / .rc1
    local e="AGREE_CASE=$1 AGREE_INI=$tmp/H.ini"
    timeout 120 "${mpi[@]}" \
        -np 1 bash -c "$e"' "$@"; echo $? > '"$tmp/hooks_$1.rc0" _ "$hooks" : \
        -np 1 bash -c "$e"' "$@"; echo $? > '"$tmp/hooks_$1.rc1" _ "$hooks" > "$tmp/hooks_$1.out" 2>&1
}
hooks2 clean
if [ "$(cat "$tmp/hooks_clean.rc0" 2>/dev/null)" != 0 ] || [ "$(cat "$tmp/hooks_clean.rc1" 2>/dev/null)" != 0 ]; then
    bad "hooks clean: two agreeing hook-level hosts did not train:"; sed 's/^/    /' "$tmp/hooks_clean.out" | head -10
else
    pass=$((pass + 1))
fi
for c in 'name:post_model_load status 2: .*on model.param\[1\]: b0.weight f32 64 .* vs b0.w f32 64' \
         'dtype:post_model_load status 2: .*on model.param\[1\]: b0.w bf16 64 .* vs b0.w f32 64' \
         'init:post_model_load status 2: .*on model.param\[2\] b1.w initial values (FNV-1a 64 of 256 bytes): [0-9a-f]* vs [0-9a-f]*' \
         'micro:pre_step status 2: .*on n_micro: 2 vs 1' \
         'fp:init status 2: .*on host.data: b vs a'; do
    n=${c%%:*}; pat=${c#*:}
    hooks2 "$n"
    for r in 0 1; do
        rc=$(cat "$tmp/hooks_$n.rc$r" 2>/dev/null || echo missing)
        if [ "$rc" != 2 ] || ! grep -q "agree rank $r: $pat" "$tmp/hooks_$n.out"; then
            bad "hooks $n: rank $r status $rc, want 2 naming '$pat':"; sed 's/^/    /' "$tmp/hooks_$n.out" | head -10
        else
            pass=$((pass + 1))
        fi
    done
done

# a rank that ends right after init, through the hooks: without a word (leave)
# rank 1 fails within seconds saying rank 0 ended its run; with dist_abort it
# fails at once with rank 0's sentence ([dist] timeout is 20 s: without the
# notices rank 1 waited all of it)
for c in 'leave:ended its run (closed the plugin' 'abort:rank 0 stopped: the host stops here'; do
    n=${c%%:*}; pat=${c#*:}
    t0=$(date +%s); hooks2 "$n"; dt=$(( $(date +%s) - t0 ))
    rc0=$(cat "$tmp/hooks_$n.rc0" 2>/dev/null || echo missing)
    rc1=$(cat "$tmp/hooks_$n.rc1" 2>/dev/null || echo missing)
    if [ "$rc0" != 3 ] || [ "$rc1" != 6 ] || [ "$dt" -gt 10 ] ||
       ! grep -q "agree rank 1: post_model_load status 6: .*$pat" "$tmp/hooks_$n.out"; then
        bad "hooks $n: rank 0 exit $rc0 (want 3), rank 1 exit $rc1 (want 6 with '$pat'), $dt s (want <= 10):"
        sed 's/^/    /' "$tmp/hooks_$n.out" | head -10
    else
        pass=$((pass + 1))
    fi
done

# world size: rank 1 told it is one of 3 under a 2-process mpirun
timeout 120 "${mpi[@]}" -np 1 bash -c '"$@"; echo $? > '"$tmp/ws.rc0" _ "$sh" "${common[@]}" $a : \
    -np 1 bash -c 'OMPI_COMM_WORLD_SIZE=3 "$@"; echo $? > '"$tmp/ws.rc1" _ "$sh" "${common[@]}" $a \
    > "$tmp/ws.out" 2>&1
for r in 0 1; do
    rc=$(cat "$tmp/ws.rc$r" 2>/dev/null || echo missing)
    if [ "$rc" != 1 ] || grep -q 'MPI_ERR\|MPI_ABORT' "$tmp/ws.out" ||
       ! grep -q "rank $r: error: .*world size mismatch: the host of MPI's rank 1.* declares world_size 3" "$tmp/ws.out"; then
        bad "world size under mpirun: rank $r exit $rc, want 1 with the sentence:"
        sed 's/^/    /' "$tmp/ws.out" | head -20
    else
        pass=$((pass + 1))
    fi
done
# ... and one process told it is one of 2, without mpirun
timeout 60 env OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 "$sh" "${common[@]}" $a \
    > "$tmp/ws1.out" 2>&1
rc=$?
if [ $rc != 1 ] || grep -q 'MPI_ERR\|MPI_ABORT' "$tmp/ws1.out" ||
   ! grep -q 'world size mismatch: .* declares world_size 2 and rank 0 in pt_host_v1, but MPI started 1 process' "$tmp/ws1.out"; then
    bad "world size without mpirun: exit $rc, want 1 with the sentence:"
    sed 's/^/    /' "$tmp/ws1.out" | head -20
else
    pass=$((pass + 1))
fi

# ... and every process told it is the only one (world size 1, rank 0) under a
# 2-process mpirun, both writing one metrics file: MPI's count is checked, so
# both refuse with the sentence and nothing is written (without the check each
# trained alone with exit 0, two runs appending to one file)
rm -f "$tmp/solo.jsonl"
timeout 120 "${mpi[@]}" -np 2 bash -c 'OMPI_COMM_WORLD_SIZE=1 OMPI_COMM_WORLD_RANK=0 '\
'OMPI_COMM_WORLD_LOCAL_RANK=0 "$@"; echo "rc $?" >> '"$tmp/solo.rc" _ \
    "$sh" "${common[@]}" $a --metrics "$tmp/solo.jsonl" > "$tmp/solo.out" 2>&1
if [ "$(grep -c '^rc 1$' "$tmp/solo.rc" 2>/dev/null)" != 2 ] || [ -s "$tmp/solo.jsonl" ] ||
   [ "$(grep -c 'declares world_size 1 and rank 0 in pt_host_v1, but MPI started 2 process' "$tmp/solo.out")" != 2 ]; then
    bad "world size 1 claimed by both of 2 processes: want exit 1 twice with the sentence, no metrics:"
    cat "$tmp/solo.rc" 2>/dev/null | sed 's/^/    /'; sed 's/^/    /' "$tmp/solo.out" | head -10
else
    pass=$((pass + 1))
fi

# A rank that refuses after init (rank 0's --resume finds its metrics file cut
# short; rank 1 resumes and trains) tells the other through the plugin's
# dist_abort: both ranks exit non-zero within seconds, rank 1 with rank 0's
# sentence, though [dist] timeout is 30 s (without the notice rank 1 waited
# the whole timeout and blamed rank 0 for not sending its part).
ini "$tmp/R.ini" ''
sed -i 's/^timeout = 20$/timeout = 30/' "$tmp/R.ini"
head -c 20000 "$root/README.md" > "$tmp/rdata.txt"
r_args="--config $tmp/R.ini --data $tmp/rdata.txt --steps 4 --checkpoint-dir $tmp/rck"
run2 rfirst "$r_args --stop-after 2 --metrics $tmp/r.jsonl" "$r_args --stop-after 2"
if [ "$(cat "$tmp/rfirst.rc0" 2>/dev/null)" != 0 ] || [ "$(cat "$tmp/rfirst.rc1" 2>/dev/null)" != 0 ]; then
    bad "refusing rank: the first half of the run failed:"; sed 's/^/    /' "$tmp/rfirst.out" | head -10
else
    head -c 20 "$tmp/r.jsonl" > "$tmp/r.cut" && mv "$tmp/r.cut" "$tmp/r.jsonl"
    t0=$(date +%s)
    run2 refuse0 "$r_args --resume --metrics $tmp/r.jsonl" "$r_args --resume"
    dt=$(( $(date +%s) - t0 ))
    sentence='--resume: metrics file .*r.jsonl is shorter'
    for r in 0 1; do
        rc=$(cat "$tmp/refuse0.rc$r" 2>/dev/null || echo missing)
        want="rank $r: error: $sentence"
        [ $r = 1 ] && want="rank 1: error: .*rank 0 stopped: $sentence"
        if [ "$rc" = 0 ] || [ "$rc" = missing ] || ! grep -q "$want" "$tmp/refuse0.out"; then
            bad "refusing rank: rank $r exit $rc, want non-zero with '$want':"
            sed 's/^/    /' "$tmp/refuse0.out" | head -10
        else
            pass=$((pass + 1))
        fi
    done
    if [ "$dt" -gt 10 ]; then
        bad "refusing rank: the pair took $dt s (want < 10 s; [dist] timeout is 30 s)"
    else
        pass=$((pass + 1))
    fi
fi

echo "dist_agree: $pass checks passed"
exit $fail
