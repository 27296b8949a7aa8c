#!/usr/bin/env bash
# debroot.sh DEBS ROOT — unpack every .deb file in DEBS (make gpu-debs) into the
# folder ROOT, emptied first, for make PT_DEBROOT=ROOT on a machine that cannot
# install packages. Nothing is written outside ROOT: no package database, no
# maintainer scripts. What those scripts would have made and the build needs is
# made here: the mpirun and mpiexec names (Debian's alternatives point them at
# Open MPI's launcher), and libpsm_infinipath.so.1 (an alternative too; ldconfig -n
# makes the soname link inside its folder, without touching the system's cache).
# The BLAS/LAPACK alternatives are not needed: the Makefile puts OpenBLAS's own
# folder on the search paths.
# Without dpkg, each package's data member is extracted with ar and tar.
set -eu -o pipefail
[ $# = 2 ] || { echo "usage: debroot.sh DEBS ROOT"; exit 2; }
debs=$1 root=$2
case "$root" in ''|/|/usr|/usr/*) echo "debroot: refusing to unpack into '$root'"; exit 2;; esac
shopt -s nullglob
files=("$debs"/*.deb)
[ ${#files[@]} -gt 0 ] || { echo "debroot: no .deb files in $debs (make gpu-debs makes them)"; exit 1; }
rm -rf "$root"
mkdir -p "$root"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
count=0
for f in "${files[@]}"; do
    # a library every image normally has: only where this machine lacks it
    case "$(basename "$f")" in
        libudev1_*) ldconfig -p 2>/dev/null | grep 'libudev\.so\.1 ' >/dev/null && { echo "debroot: skipping $(basename "$f") (the machine has libudev.so.1)"; continue; } ;;
    esac
    if dpkg --version >/dev/null 2>&1; then
        dpkg -x "$f" "$root"
    else
        member=$(ar t "$f" | grep '^data\.tar') || { echo "debroot: $f has no data member"; exit 1; }
        af=$(cd "$(dirname "$f")" && pwd)/$(basename "$f")
        (cd "$tmp" && ar x "$af" "$member")
        tar -xf "$tmp/$member" -C "$root"
        rm -f "$tmp/$member"
    fi
    count=$((count + 1))
done
for n in mpirun mpiexec; do
    [ -e "$root/usr/bin/$n.openmpi" ] && ln -sfn "$n.openmpi" "$root/usr/bin/$n"
done
[ -d "$root/usr/lib/libpsm1" ] && ldconfig -n "$root/usr/lib/libpsm1"
echo "debroot: $count of ${#files[@]} packages unpacked into $root ($(du -sh "$root" | cut -f1))"
