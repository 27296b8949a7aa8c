# Shared by tests/nvme.sh and tests/nvme_images.sh (sourced, not run): the
# losses of a sample_host metrics file, two ranks under mpirun with the
# sanitizers' Open MPI settings, and "within a relative bound" for runs whose
# sums run in another order.

losses() { sed -n 's/.*"loss":\([^,]*\),.*/\1/p' "$1"; }

# mpi=(mpirun ... -np 2), and under a sanitizer build Open MPI's own
# allocations and races set aside, as in tests/dist.sh
tier_mpi_setup() {
    mpi=(mpirun --oversubscribe --allow-run-as-root -np 2)
    if [ -n "${PT_SAN:-}" ]; then
        export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
        export TSAN_OPTIONS="${TSAN_OPTIONS:-} suppressions=$root/tests/tsan_openmpi.supp"
    fi
}

# tier_close A.jsonl B.jsonl N BOUND: both hold N losses, each pair within BOUND relative
tier_close() {
    awk -v a="$(losses "$1" | tr '\n' ' ')" -v b="$(losses "$2" | tr '\n' ' ')" -v n="$3" -v t="$4" 'BEGIN {
        k = split(a, x, " "); m = split(b, y, " "); if (k != n || m != n) exit 1
        for (i = 1; i <= k; i++) { d = (x[i] - y[i]) / x[i]; if (d < 0) d = -d; if (d > t) exit 1 } }'
}
