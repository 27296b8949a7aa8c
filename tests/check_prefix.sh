#!/usr/bin/env bash
# One public name prefix per file (make test runs this). Every C file under
# runtime/, gpu/, plugin/, host_api/ and sample_host/ defines its non-static
# functions under one prefix, so a name says which file holds it:
#   pt_<word>_   in the plugin's layers and host_api/ (a name that is the prefix
#                itself, pt_<word>, counts as under pt_<word>_);
#   sh_<word>_   in sample_host/ (the host program's own namespace: its names
#                never clash with the plugin's when a test links both).
# The names come from the built objects ($PT_BUILD/obj/<file>.o, nm
# --defined-only, global text symbols), so a definition spread over lines or
# made by a macro is seen as the linker sees it. A C file with no object here
# (compiled straight into a library or program) is read from its source: a
# line that starts with a return type and ends the name with '(' (the tree's
# style), less `static`. `main` is no file's name.
set -u
cd "${PT_ROOT:-$(dirname "$0")/..}" || exit 2
BUILD=${PT_BUILD:-build}
fail=0
bad() { echo "prefix: $*"; fail=1; }

# Files that still mix prefixes, each with why it is left. The check skips
# them; a listed file that passes is reported, so the list only shrinks.
declare -A allow=(   # none now
)

# names_obj OBJ / names_src SRC: the file's public function names, one a line
names_obj() { nm --defined-only -g "$1" | awk '$2 == "T" { print $3 }' | grep -vx main; }
names_src() {
  grep -E '^[A-Za-z_][A-Za-z0-9_ *]*[ *][A-Za-z_][A-Za-z0-9_]*\(' "$1" | grep -vE '^(static|typedef|extern)\b' |
    sed -E 's/^[^(]*[ *]([A-Za-z_][A-Za-z0-9_]*)\(.*/\1/' | grep -vx main
}
# prefixes NS: the distinct <ns>_<word>_ prefixes of the names on stdin; a
# name outside the namespace prints itself (so it never matches a prefix)
prefixes() {
  awk -F_ -v ns="$1" '$1 == ns && NF >= 2 && $2 != "" { print $1 "_" $2 "_"; next } { print "(" $0 ")" }' | sort -u
}
# check FILE NAMES-FILE NS: 0 when the names share one prefix of the
# namespace, else a message (a name outside it fails alone: one such name is
# one "prefix" by count, but no prefix at all)
check() {
  local p; p=$(prefixes "$3" < "$2" | tr '\n' ' ')
  if grep -q '(' <<<"$p"; then echo "$1 has public names outside ${3}_<word>_: $p"; return 1; fi
  [ "$(wc -w <<<"$p")" -le 1 ] && return 0
  echo "$1 mixes prefixes: $p"; return 1
}

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# Negative control: an object with two prefixes must fail, one with one pass.
cat > "$tmp/two.c" <<'EOF'
int pt_alpha_one(void) { return 1; }
int pt_beta_two(void) { return 2; }
static int helper(void) { return 3; }
int pt_alpha_three(void) { return helper(); }
EOF
if ! ${CC:-cc} -c -o "$tmp/two.o" "$tmp/two.c"; then bad "cannot compile the negative control"; fi
names_obj "$tmp/two.o" > "$tmp/n"
check two.c "$tmp/n" pt > /dev/null && bad "negative control: a file with pt_alpha_ and pt_beta_ passed (object)"
names_src "$tmp/two.c" > "$tmp/n"
check two.c "$tmp/n" pt > /dev/null && bad "negative control: a file with pt_alpha_ and pt_beta_ passed (source)"
grep -v pt_beta_two "$tmp/two.c" > "$tmp/one.c"
names_src "$tmp/one.c" > "$tmp/n"
check one.c "$tmp/n" pt > /dev/null || bad "control: a file with pt_alpha_ only failed"
# ... and a file whose one public function has no prefix must fail too
printf 'int helper_one(void) { return 1; }\n' > "$tmp/bare.c"
if ! ${CC:-cc} -c -o "$tmp/bare.o" "$tmp/bare.c"; then bad "cannot compile the negative control"; fi
names_obj "$tmp/bare.o" > "$tmp/n"
check bare.c "$tmp/n" pt > /dev/null && bad "negative control: a file with one unprefixed function passed (object)"
names_src "$tmp/bare.c" > "$tmp/n"
check bare.c "$tmp/n" pt > /dev/null && bad "negative control: a file with one unprefixed function passed (source)"

checked=0; skipped=0
while IFS= read -r f; do
  case $f in sample_host/*) ns=sh ;; *) ns=pt ;; esac
  o="$BUILD/obj/${f%.c}.o"
  if [ -e "$o" ]; then names_obj "$o"; else names_src "$f"; fi > "$tmp/n"
  if msg=$(check "$f" "$tmp/n" "$ns"); then
    [ -n "${allow[$f]:-}" ] && bad "$f is allow-listed but has one prefix now: take it off the list"
  elif [ -n "${allow[$f]:-}" ]; then
    skipped=$((skipped + 1)); continue
  else
    bad "$msg"
  fi
  checked=$((checked + 1))
done < <(find runtime gpu plugin host_api sample_host -name '*.c' | sort)
for f in "${!allow[@]}"; do [ -e "$f" ] || bad "allow-listed $f does not exist: take it off the list"; done

echo "prefix: $checked files with one prefix, $skipped allow-listed"
if [ $fail = 0 ]; then echo "prefix: 1 passed, 0 failed"; else echo "prefix: 0 passed, 1 failed"; fi
exit $fail
