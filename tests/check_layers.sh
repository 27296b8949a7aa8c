#!/usr/bin/env bash
# The layering rules, checked on the sources (make test runs this). The build
# already compiles each layer with only the include paths it may use; this
# adds what include paths cannot express:
#  1. runtime/ includes no CUDA, NCCL or MPI header (system or local);
#  2. inside runtime/, a file reaches another subsystem only through that
#     subsystem's interface header (base/base.h, optim/optim.h,
#     planner/planner.h, store/store.h, core/rt.h, osft/osft.h,
#     tiled/tiled.h); the features that extend the runtime object (osft/,
#     tiled/) may also include core/rt_internal.h, and nothing else may;
#     a subsystem's subfolder (runtime/store/kinds/) reaches its parent's
#     headers by relative path ("../store_internal.h") and the parent its
#     headers as "kinds/..."; REKLS's private header store/kinds/rekls_store.h
#     is included by store/kinds/*.c only (so the store's own files cannot
#     reach REKLS's private state);
#  2b. runtime/optim (the math: worker pool, CPU AdamW, the REKLS step) includes
#     no store header: the store uses optim, never the other way round;
#  2c. runtime/core names the features that extend it (osft/, tiled/) only in
#     rt_ext.c, their list: no other core file includes a feature's header or
#     calls a pt_osft_ / pt_tiled_ function (it reaches them through pt_rt_ext);
#     of the collectives (gpu/coll/) runtime sees only coll/coll.h; and
#     store/ord_bits.h (the testing ordering bits, kept out of store.h's
#     interface, which the code honouring an ordering and the tests name);
#  3. sample_host/ includes nothing but host_api headers and system headers;
#  4. no two headers or sources include each other in a loop;
#  1b. an MPI header only in gpu/coll/mpi/ (the MPI transport of the collectives);
#  1c. an NCCL header only in gpu/coll/nccl/ (the NCCL transport, its own library);
#  1d. a CUDA header only in gpu/cuda/, gpu/coll/nccl/ and sample_host/cuda/ (the
#      libraries the plugin dlopens), and CUDA C++ (.cu/.cuh) only in a cuda/
#      folder.
set -u
cd "${PT_ROOT:-$(dirname "$0")/..}" || exit 2
fail=0
bad() { echo "layers: $*"; fail=1; }

# 1
while IFS= read -r hit; do bad "runtime must not include device/transport headers: $hit"; done < <(
  grep -rnE '#\s*include\s*[<"](cuda|cublas|cusolver|nccl|mpi)[^">]*[">]' runtime)

# 1b: MPI only behind gpu/coll/coll.h, in gpu/coll/mpi/ (plugin, host_api, sample_host and
# the rest of gpu/ must not see a transport's types either)
while IFS= read -r hit; do bad "only gpu/coll/mpi/ may include an MPI header: $hit"; done < <(
  grep -rnE '#\s*include\s*[<"]mpi[^">]*[">]' host_api gpu plugin sample_host | grep -v '^gpu/coll/mpi/')

# 1c: NCCL only in the NCCL transport
while IFS= read -r hit; do bad "only gpu/coll/nccl/ may include an NCCL header: $hit"; done < <(
  grep -rnE '#\s*include\s*[<"]nccl[^">]*[">]' host_api gpu plugin sample_host | grep -v '^gpu/coll/nccl/')

# 1d: CUDA headers only in the separately built CUDA libraries; .cu only under cuda/
while IFS= read -r hit; do bad "a CUDA header outside gpu/cuda/, gpu/coll/nccl/, sample_host/cuda/: $hit"; done < <(
  grep -rnE '#\s*include\s*[<"](cuda|cublas|cusolver|curand)[^">]*[">]' host_api gpu plugin sample_host |
  grep -vE '^(gpu/cuda|gpu/coll/nccl|sample_host/cuda)/')
while IFS= read -r f; do bad "CUDA C++ outside a cuda/ folder: $f"; done < <(
  find host_api gpu plugin sample_host runtime -name '*.cu' -o -name '*.cuh' | grep -v '/cuda/')

# 2
declare -A iface=([base]=base.h [optim]=optim.h [planner]=planner.h [store]=store.h [core]=rt.h
                  [osft]=osft.h [tiled]=tiled.h)
# the runtime object's extensions and the one header beyond core/rt.h they may reach
declare -A ext_ok=([osft]=core/rt_internal.h [tiled]=core/rt_internal.h)
rk_users='^runtime/store/kinds/[^/]*\.c$'
while IFS= read -r f; do bad "$f includes REKLS's private header store/kinds/rekls_store.h: only runtime/store/kinds/*.c may"; done < <(
  grep -rlE '#\s*include\s*"(store/kinds/|kinds/)?rekls_store\.h"' host_api gpu plugin sample_host runtime | grep -vE "$rk_users")
# 2b
while IFS= read -r hit; do bad "runtime/optim must not include a store header: $hit"; done < <(
  grep -rnE '#\s*include\s*"(\.\./)?store/' runtime/optim)
# 2c
while IFS= read -r hit; do bad "only core/rt_ext.c may name a feature of the runtime object: $hit"; done < <(
  grep -nE '#\s*include\s*"(osft|tiled)/|\bpt_(osft|tiled)_' runtime/core/*.[ch] | grep -v '^runtime/core/rt_ext\.c:')
for f in runtime/*/*.[ch] runtime/*/*/*.[ch]; do
  [ -e "$f" ] || continue
  sub=${f#runtime/}; sub=${sub%%/*}
  while IFS= read -r inc; do
    dir=${inc%%/*}; file=${inc#*/}
    [ "$dir" = "$inc" ] && continue            # same-folder include
    if [ -e "$(dirname "$f")/$inc" ]; then     # relative to the file: inside its own subsystem only
      rel=$(realpath -m --relative-to=runtime "$(dirname "$f")/$inc")
      [ "${rel%%/*}" = "$sub" ] || bad "$f includes \"$inc\": a relative include leaves runtime/$sub"
      continue
    fi
    if [ -e "gpu/$inc" ]; then                 # a gpu/ header (the build's -Igpu)
      [ "$dir" != coll ] || [ "$inc" = coll/coll.h ] ||
        bad "$f includes \"$inc\": only coll/coll.h crosses into the collectives (gpu/coll/)"
      continue
    fi
    [ -n "${iface[$dir]:-}" ] || { bad "$f includes \"$inc\": no such subsystem"; continue; }
    [ "$dir" = "$sub" ] && { bad "$f includes its own subsystem as \"$inc\" (use \"$file\")"; continue; }
    [ "$inc" = "${ext_ok[$sub]:-}" ] && continue
    [ "$inc" = store/ord_bits.h ] && continue   # the testing ordering bits
    [ "$file" = "${iface[$dir]}" ] || bad "$f includes \"$inc\": only $dir/${iface[$dir]} crosses the $dir boundary"
  done < <(sed -n 's/^#\s*include\s*"\([^"]*\)".*/\1/p' "$f")
done

# 3
while IFS= read -r hit; do
  inc=$(sed -n 's/.*#\s*include\s*"\([^"]*\)".*/\1/p' <<<"${hit#*:*:}")
  [ -e "sample_host/$inc" ] || [ -e "host_api/$inc" ] || bad "sample_host may include only host_api headers: $hit"
done < <(grep -rnE '#\s*include\s*"' sample_host)

# 4: every quoted include resolved to a file, fed to tsort (which reports loops)
edges=$(for f in $(find host_api gpu runtime plugin sample_host -name '*.[ch]'); do
  d=$(dirname "$f")
  sed -n 's/^#\s*include\s*"\([^"]*\)".*/\1/p' "$f" | while IFS= read -r inc; do
    for c in "$d/$inc" "runtime/$inc" "gpu/$inc" "host_api/$inc" "plugin/$inc"; do
      if [ -e "$c" ]; then echo "$(realpath --relative-to=. "$f") $(realpath --relative-to=. "$c")"; break; fi
    done
  done
done)
if ! out=$(tsort <<<"$edges" 2>&1 >/dev/null) || [ -n "$out" ]; then bad "include loop: $out"; fi

if [ $fail = 0 ]; then echo "layers: 1 passed, 0 failed"; else echo "layers: 0 passed, 1 failed"; fi
exit $fail
