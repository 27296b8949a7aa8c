#!/usr/bin/env bash
# The minimal host in README.md is real code: this script takes the first ```c block
# after the heading "## A minimal host", compiles it against host_api/ and the
# loader objects of the build (-Werror), runs it on the host backend against
# build/protrain_plugin.so, and checks its exit status and every printed loss against
# an independent AdamW reference in double precision (awk):
#   loss_t = sum(w^2)/2 before step t, w0 = (1, -2, 3, -4), grad = w,
#   lr 0.1, betas (0.9, 0.999), eps 1e-8, no decay, bias-corrected.
set -u
root="${PT_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}"
build="${PT_BUILD:-$root/build}"
if [ -n "${PT_SAN:-}" ]; then
    # the sanitizer build's loader objects need the sanitizer runtime at link time
    echo "readme_host: skipped under SAN=$PT_SAN"; exit 0
fi
fail() { echo "readme_host: FAIL: $*"; exit 1; }
for f in "$build/protrain_plugin.so" "$build/obj/host_api/loader.o" "$build/obj/host_api/util.o"; do
    [ -f "$f" ] || fail "$f is missing (run make first)"
done
tmp=$(mktemp -d /tmp/readme_host.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

awk '/^## A minimal host/ { seen = 1; next }
     seen && !inside && /^```c[[:space:]]*$/ { inside = 1; next }
     inside && /^```/ { exit }
     inside { print }' "$root/README.md" >"$tmp/host.c"
[ -s "$tmp/host.c" ] || fail "README.md has no \`\`\`c block after '## A minimal host'"
echo "  extracted $(wc -l <"$tmp/host.c") lines of C from README.md"

cc -std=c11 -Wall -Wextra -Werror -I"$root/host_api" -o "$tmp/host" "$tmp/host.c" \
   "$build/obj/host_api/loader.o" "$build/obj/host_api/util.o" -ldl 2>"$tmp/cc.log" ||
    { cat "$tmp/cc.log"; fail "the README host does not compile"; }

printf '[plugin]\nbackend = host\nlog_level = warn\n' >"$tmp/readme.ini"
env PROTRAIN_PLUGIN_PATH="$build" PROTRAIN_CONFIG="$tmp/readme.ini" "$tmp/host" \
    >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc != 0 ]; then cat "$tmp/out" "$tmp/err"; fail "the README host exited with status $rc"; fi
[ -s "$tmp/err" ] && { echo "  its stderr:"; sed 's/^/    /' "$tmp/err"; }

# every step's loss against the reference, 1e-5 relative (fp32 AdamW vs double)
awk 'BEGIN { split("1 -2 3 -4", w, " "); for (i = 1; i <= 4; i++) { m[i] = 0; v[i] = 0 }
             b1 = 0.9; b2 = 0.999; lr = 0.1; eps = 1e-8; steps = 0; bad = 0 }
     $1 == "step" && $3 == "loss" {
         t = $2; steps++
         if (t != steps) { print "  step " t " out of order"; bad = 1; exit }
         want = 0; for (i = 1; i <= 4; i++) want += w[i] * w[i] / 2
         if ($4 - want > 1e-5 * want || want - $4 > 1e-5 * want) {
             printf "  step %d: loss %s, reference %.6f\n", t, $4, want; bad = 1 }
         for (i = 1; i <= 4; i++) {
             g = w[i]; m[i] = b1 * m[i] + (1 - b1) * g; v[i] = b2 * v[i] + (1 - b2) * g * g
             w[i] -= lr * (m[i] / (1 - b1 ^ t)) / (sqrt(v[i] / (1 - b2 ^ t)) + eps) }
         if (t == 1 || t == 20) printf "  step %d loss %s (reference %.6f)\n", t, $4, want }
     END { if (steps != 20) { print "  " steps " steps printed, want 20"; bad = 1 }
           exit bad }' "$tmp/out" || fail "the README host's losses differ from the AdamW reference"
echo "readme_host: passed"
