#!/usr/bin/env bash
# make install / make uninstall into a temporary prefix, and a tiny host built only
# from what was installed (pkg-config --cflags --libs protrain) that loads the plugin
# by its short name. Checks the short-name search order (protrain.h):
#   $PROTRAIN_PLUGIN_PATH, then beside the host binary, then the installed libdir;
# that the installed sample_host and protrain-plan run from the prefix; and that
# make uninstall removes every installed file.
set -u
root="${PT_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}"
build="${PT_BUILD:-$root/build}"
if [ -n "${PT_SAN:-}" ]; then
    # a sanitizer-built plugin cannot be loaded by the uninstrumented tiny host
    echo "install: skipped under SAN=$PT_SAN"; exit 0
fi
fail=0
bad() { echo "install: FAIL: $*"; fail=1; }
tmp=$(mktemp -d /tmp/test_install.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
pfx="$tmp/pfx"

if ! make -C "$root" --no-print-directory install PREFIX="$pfx" BUILD="$build" >"$tmp/install.log" 2>&1; then
    cat "$tmp/install.log"; echo "install: FAIL: make install"; exit 1
fi
for f in lib/protrain_plugin.so lib/libprotrain_loader.a lib/pkgconfig/protrain.pc \
         include/protrain.h bin/sample_host bin/protrain-plan share/protrain/default.ini; do
    [ -f "$pfx/$f" ] || bad "make install did not install $f"
done
if [ -f "$build/libprotrain_cuda.so" ]; then
    [ -f "$pfx/lib/libprotrain_cuda.so" ] || bad "libprotrain_cuda.so was built but not installed"
fi

command -v pkg-config >/dev/null || { echo "install: FAIL: pkg-config missing (make deps)"; exit 1; }
flags=$(PKG_CONFIG_PATH="$pfx/lib/pkgconfig" pkg-config --cflags --libs protrain) ||
    { echo "install: FAIL: pkg-config does not know protrain"; exit 1; }
mkdir -p "$tmp/host"
cat >"$tmp/host/host.c" <<'C'
/* A host that knows protrain only through the installed header and loader. */
#include <protrain.h>
#include <stdio.h>
int main(int argc, char **argv) {
    pt_loaded_plugin p;
    char err[2048];
    if (pt_plugin_load(argc > 1 ? argv[1] : "protrain", &p, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    printf("%s\n", p.path);
    pt_plugin_unload(&p);
    return 0;
}
C
# shellcheck disable=SC2086  # $flags is a word list by design
if ! cc -std=c11 -Wall -Wextra -Werror -o "$tmp/host/host" "$tmp/host/host.c" $flags 2>"$tmp/cc.log"; then
    cat "$tmp/cc.log"; echo "install: FAIL: tiny host does not build with: $flags"; exit 1
fi

expect_load() { # what env... : the host must print `want`
    local what="$1" want="$2" exe="$3"; shift 3
    local got
    got=$(env -u PROTRAIN_PLUGIN_PATH "$@" "$exe" 2>&1)
    if [ "$got" = "$want" ]; then echo "  $what: $got"; else bad "$what: loaded '$got', want '$want'"; fi
}
alt="$tmp/alt"; side="$tmp/side"
mkdir -p "$alt" "$side"
cp "$build/tests/plugins/good.so" "$alt/protrain_plugin.so"
cp "$build/tests/plugins/good.so" "$side/libprotrain.so"
cp "$tmp/host/host" "$side/host"
expect_load "installed libdir" "$pfx/lib/protrain_plugin.so" "$tmp/host/host"
expect_load "PROTRAIN_PLUGIN_PATH" "$alt/protrain_plugin.so" "$tmp/host/host" \
    PROTRAIN_PLUGIN_PATH="$tmp/none:$alt"
expect_load "beside the host" "$side/libprotrain.so" "$side/host"
expect_load "PROTRAIN_PLUGIN_PATH before beside" "$alt/protrain_plugin.so" "$side/host" \
    PROTRAIN_PLUGIN_PATH="$alt"

# the installed programs run from the prefix (sample_host finds the plugin in libdir)
for i in $(seq 200); do echo "line $i of a small corpus for the installed sample_host"; done >"$tmp/corpus.txt"
out=$(cd "$tmp" && env -u PROTRAIN_PLUGIN_PATH "$pfx/bin/sample_host" --data "$tmp/corpus.txt" \
      --config "$pfx/share/protrain/default.ini" --layers 1 --channels 32 --heads 2 \
      --seq 16 --batch 2 --steps 2 --val-every 0 --val-batches 1 --gen-every 0 \
      --progress off 2>&1) || bad "installed sample_host failed: $out"
case "$out" in
    *"plugin $pfx/lib/protrain_plugin.so"*) echo "  installed sample_host: plugin from $pfx/lib" ;;
    *) bad "installed sample_host did not use the installed plugin: $out" ;;
esac
"$pfx/bin/protrain-plan" --help >/dev/null 2>&1 || bad "installed protrain-plan --help failed"

make -C "$root" --no-print-directory uninstall PREFIX="$pfx" BUILD="$build" >"$tmp/un.log" 2>&1 ||
    bad "make uninstall failed: $(cat "$tmp/un.log")"
left=$(find "$pfx" -type f 2>/dev/null)
[ -z "$left" ] || bad "make uninstall left: $left"
msg=$(env -u PROTRAIN_PLUGIN_PATH "$tmp/host/host" 2>&1) && bad "host still loaded '$msg' after uninstall"
case "$msg" in
    *"plugin file not found: protrain"*PROTRAIN_PLUGIN_PATH*) echo "  after uninstall: $msg" ;;
    *) bad "after uninstall, unexpected message: $msg" ;;
esac
[ $fail = 0 ] && echo "install: passed"
exit $fail
