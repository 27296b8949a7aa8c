#!/usr/bin/env bash
# sample_host's outputs and limits, through the binary (what a process sees):
#  1. --save onto a character device node (mknod of /dev/full's device, root
#     only) and --metrics onto a FIFO without a reader: refused at once with
#     a sentence (exit 1); the node is still a device, the FIFO still a FIFO.
#  2. --metrics onto the training data: refused, the data keeps its bytes.
#  3. `ulimit -f` below a generation's size, resumed from a generation
#     written without the limit: exit 1 with "File too large" (not killed by
#     SIGXFSZ), the earlier generation kept, no temp folder left, and a
#     resume without the limit continues from it.
#  4. `ulimit -v 200000`: exit 1 with the address-space sentence within 60 s
#     (OpenBLAS's allocator used to retry forever).
#  5. two runs on one --checkpoint-dir: while the first holds it, a second
#     writer and a second --resume are refused naming the first's pid; the
#     first ends with its last generation whole.
#  6. --resume with --load: a note that --load is not used; an option given
#     twice: a note with both values, the last used.
#  7. [protrain] n_buffer = 2147483647 with auto_memory = false: the plugin
#     warns that it makes only the streamed chunks' count of buffers.
# SH_BIN=PATH runs another sample_host binary (a negative control: a build
# without these checks fails 1-5).
set -u
root="${PT_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}"
build="${PT_BUILD:-$root/build}"
sh="${SH_BIN:-$build/sample_host}"
fail=0; pass=0
bad() { echo "sh_outputs: FAIL: $*"; fail=1; }
ok() { pass=$((pass + 1)); }
tmp=$(mktemp -d /tmp/test_sh_outputs_sh.XXXXXX)
trap '[ -n "${PT_KEEP:-}" ] || rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" OMP_WAIT_POLICY=PASSIVE
awk 'BEGIN { for (i = 0; i < 3000; i++) printf "line %d of a small corpus. ", i % 17 }' \
    > "$tmp/data.txt"
A=(--no-plugin --quiet --layers 1 --channels 16 --heads 2 --seq 8 --batch 2 --val-every 0
   --gen-every 0 --data "$tmp/data.txt")

# 1. device node and FIFO
if [ "$(id -u)" = 0 ] && mknod "$tmp/full" c 1 7 2>/dev/null; then
    timeout 60 "$sh" "${A[@]}" --steps 2 --save "$tmp/full" > "$tmp/1.out" 2>&1; rc=$?
    if [ $rc = 1 ] && grep -q "character device" "$tmp/1.out" && [ -c "$tmp/full" ]; then ok
    else bad "--save onto a device node: exit $rc, $( [ -c "$tmp/full" ] && echo 'still a device' || echo 'REPLACED')"; fi
else
    echo "sh_outputs: not root: the device-node case is skipped"
fi
mkfifo "$tmp/fifo"
timeout 20 "$sh" "${A[@]}" --steps 2 --metrics "$tmp/fifo" > "$tmp/1b.out" 2>&1; rc=$?
if [ $rc = 1 ] && grep -q "a FIFO" "$tmp/1b.out" && [ -p "$tmp/fifo" ]; then ok
else bad "--metrics onto a FIFO: exit $rc (124: it waited for a reader)"; fi

# 2. metrics onto the data
n0=$(stat -c %s "$tmp/data.txt")
(cd "$tmp" && timeout 60 "$sh" "${A[@]}" --steps 2 --metrics ./data.txt) > "$tmp/2.out" 2>&1; rc=$?
n1=$(stat -c %s "$tmp/data.txt")
if [ $rc = 1 ] && grep -q "an input of this run" "$tmp/2.out" && [ "$n0" = "$n1" ]; then ok
else bad "--metrics onto --data: exit $rc, data $n0 -> $n1 bytes"; fi

# 3. ulimit -f: a generation of this model is ~90 KB, the limit 50 KiB
ck="$tmp/ckf"
"$sh" "${A[@]}" --steps 4 --stop-after 2 --checkpoint-dir "$ck" > "$tmp/3a.out" 2>&1 ||
    bad "writing generation 2: $(tail -2 "$tmp/3a.out")"
(ulimit -f 50; exec timeout 60 "$sh" "${A[@]}" --steps 4 --checkpoint-dir "$ck" --resume) \
    > "$tmp/3.out" 2>&1; rc=$?
left=$(ls "$ck" | grep -c '\.tmp\.')
if [ $rc = 1 ] && grep -q "File too large" "$tmp/3.out" && [ -f "$ck/gen-00000002/MANIFEST" ] &&
   [ "$left" = 0 ]; then ok
else bad "ulimit -f: exit $rc (153: killed by SIGXFSZ), gen-2 $( [ -f "$ck/gen-00000002/MANIFEST" ] && echo kept || echo LOST), $left temp folder(s): $(tail -1 "$tmp/3.out")"; fi
if timeout 60 "$sh" "${A[@]}" --steps 4 --checkpoint-dir "$ck" --resume > "$tmp/3b.out" 2>&1 &&
   [ -f "$ck/gen-00000004/MANIFEST" ]; then ok
else bad "resume after the ulimit -f failure: $(tail -2 "$tmp/3b.out")"; fi

# 4. ulimit -v (not under a sanitizer: its shadow memory needs terabytes of
# address space, so the process could not start under any such limit)
if [ -z "${PT_SAN:-}" ]; then
    (ulimit -v 200000; exec timeout 60 "$sh" "${A[@]}" --steps 2) > "$tmp/4.out" 2>&1; rc=$?
    if [ $rc = 1 ] && grep -q "address-space limit" "$tmp/4.out"; then ok
    else bad "ulimit -v 200000: exit $rc (124: hung)"; fi
else
    echo "sh_outputs: PT_SAN=$PT_SAN: the ulimit -v case is skipped"
fi

# 5. two runs, one folder (the first slowed by the testing knob: 300 ms per file)
ck="$tmp/ckl"
PROTRAIN_TESTING=1 "$sh" "${A[@]}" --steps 6 --checkpoint-dir "$ck" --checkpoint-every 1 \
    --checkpoint-keep 1 --debug-save-sleep-ms 300 > "$tmp/5a.out" 2>&1 &
first=$!
for _ in $(seq 50); do [ -s "$ck/.lock" ] && break; sleep 0.1; done
timeout 60 "$sh" "${A[@]}" --steps 6 --checkpoint-dir "$ck" --checkpoint-keep 1 > "$tmp/5b.out" 2>&1; rc2=$?
timeout 60 "$sh" "${A[@]}" --steps 6 --checkpoint-dir "$ck" --resume > "$tmp/5c.out" 2>&1; rc3=$?
wait $first; rc1=$?
if [ $rc1 = 0 ] && [ $rc2 = 1 ] && [ $rc3 = 1 ] && grep -q "in use by process $first" "$tmp/5b.out" &&
   grep -q "in use by process $first" "$tmp/5c.out" && [ -f "$ck/gen-00000006/MANIFEST" ]; then ok
else bad "one folder, two runs: first exit $rc1, second writer $rc2, second --resume $rc3 (0: both ran); $(tail -1 "$tmp/5b.out")"; fi

# 6. notes
"$sh" "${A[@]}" --steps 2 --save "$tmp/w.bin" > /dev/null 2>&1
"$sh" "${A[@]}" --steps 2 --checkpoint-dir "$tmp/ck6" > /dev/null 2>&1
"$sh" "${A[@]}" --steps 2 --checkpoint-dir "$tmp/ck6" --resume --load "$tmp/w.bin" \
    > "$tmp/6.out" 2>&1; rc=$?
if [ $rc = 0 ] && grep -q "load $tmp/w.bin is not used" "$tmp/6.out"; then ok
else bad "--resume --load: exit $rc, no note"; fi
"$sh" "${A[@]}" --steps 2 --steps 1 --metrics "$tmp/6.jsonl" > "$tmp/6b.out" 2>&1; rc=$?
if [ $rc = 0 ] && grep -q "steps is given twice (2, then 1)" "$tmp/6b.out" &&
   [ "$(wc -l < "$tmp/6.jsonl")" = 1 ]; then ok
else bad "--steps 2 --steps 1: exit $rc, no note or not 1 step"; fi

# 7. n_buffer above the streamed chunks
printf '[protrain]\nauto_memory = false\nn_persist = 0\nn_buffer = 2147483647\nn_swap = 0\nn_checkpoint = 0\n' \
    > "$tmp/nb.ini"
P=("${A[@]:1}")   # with the plugin
"$sh" "${P[@]}" --layers 2 --steps 1 --config "$tmp/nb.ini" > "$tmp/7.out" 2>&1; rc=$?
if [ $rc = 0 ] && grep -q "n_buffer = 2147483647 (INI) is more than the" "$tmp/7.out"; then ok
else bad "n_buffer = 2147483647: exit $rc, no warning"; fi

echo "sh_outputs: $pass passed$( [ $fail = 0 ] || echo ', FAILURES above')"
exit $fail
