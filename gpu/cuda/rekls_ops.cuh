/*
 * rekls_ops.cuh — the cuda backend's REKLS ops (eigh: cuSOLVER syevd with an
 * fp64 retry, sorted descending; rekls_ew: the shared element bodies of
 * gpu/kernels_hd.h). Included once, by backend.cu, inside its anonymous
 * namespace: it uses that file's impl struct, error reporting and device scope.
 * Compiled on every build; not yet run on a GPU.
 */
/* ---- REKLS: eigendecomposition (cuSOLVER syevd) and element kernels; its GEMMs are
 * gemm_f32 ---- */

__global__ void k_rekls_ew(pt_rekls_ew_args a) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += stride) {
        switch (a.kind) {
        case PT_RK_GRAD_IN: a.x[i] = pt_load_elem(a.src, a.src_dtype, i) * a.a; break;
        case PT_RK_SCALE_COLS: a.x[i] = a.y[i] * pt_rekls_inv_elem(a.lam[i % a.cols], a.b, a.c0); break;
        case PT_RK_LERP: a.x[i] = pt_rekls_lerp_elem(a.x[i], a.y[i], a.a); break;
        case PT_RK_COPY: a.x[i] = a.y[i]; break;
        case PT_RK_AXPY: a.x[i] = pt_rekls_axpy_elem(a.x[i], a.y[i], a.a); break;
        case PT_RK_ADAM: {
            float m = a.m[i], v = a.v[i];
            a.x[i] = pt_rekls_adam_elem(a.x[i], &m, &v, a.a, a.b, a.c0, a.c1, a.c2);
            a.m[i] = m;
            a.v[i] = v;
            break;
        }
        case PT_RK_APPLY: {
            float p = pt_rekls_apply_elem(a.x[i], a.y[i], a.a, a.c0);
            a.x[i] = p;
            if (a.dst) pt_store_elem(a.dst, a.dst_dtype, i, p);
            break;
        }
        default: break;
        }
    }
}

/* LAPACK-style output of syevd (column-major: eigenvector j = column j, values
 * ascending) -> this interface's (row-major, eigenvector j = column j, values
 * descending): out[r n + j] = V[(n-1-j) n + r]. */
template <typename T>
__global__ void k_eig_reorder(const T *V, const T *w, float *out, float *wout, int n) {
    size_t nn = (size_t)n * n, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nn; i += stride) {
        size_t r = i / n, j = i % n;
        out[i] = (float)V[(size_t)(n - 1 - j) * n + r];
        if (r == 0) wout[j] = (float)w[n - 1 - j];
    }
}
__global__ void k_to_f64(const float *x, double *y, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = x[i];
}
__global__ void k_nonfinite(const float *x, size_t n, int *flag) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        if (!isfinite(x[i])) *flag = 1;
}
__global__ void k_fill_nan(float *x, size_t n, int *status) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) x[i] = NAN;
    if (status && blockIdx.x == 0 && threadIdx.x == 0) *status = 1;
}

/* The cuSOLVER handle (and cuBLAS's, which the GEMMs create the same way),
 * created at first use; called under la_mu. */
int rekls_handles(void *impl) {
    cuda_impl *c = (cuda_impl *)impl;
    if (!c->solver && cusolverDnCreate(&c->solver) != CUSOLVER_STATUS_SUCCESS) {
        c->solver = nullptr;
        return la_fail(impl, "cusolverDnCreate", 0);
    }
    return 0;
}

/* syevd in fp32; when it reports no convergence, again in fp64 from a copy of
 * the input. Deciding on the retry needs syevd's info on the host, so this op
 * synchronises its stream once. A row-major symmetric matrix read column-major
 * is itself; its upper triangle is the column-major lower one. */
int be_eigh(void *impl, int n, float *A, float *w, int *status, pt_stream *s) {
    if (n < 0 || (n && (!A || !w))) return PT_ERR_INVALID_ARG;
    USE(impl);
    if (n == 0) return 0;
    cuda_impl *c = (cuda_impl *)impl;
    std::lock_guard<std::mutex> lock(c->la_mu);
    if (int rc = rekls_handles(impl)) return rc;
    cudaStream_t cs = st(s);
    size_t nn = (size_t)n * n;
    char msg[240];
    int lw32 = 0, lw64 = 0, info = 0, bad = 0;
    float *V = nullptr, *work = nullptr, *wv = nullptr;
    double *Vd = nullptr, *workd = nullptr, *wd = nullptr;
    int *dinfo = nullptr;
    int rc = 0;
    const cublasFillMode_t lo = CUBLAS_FILL_MODE_LOWER;
    const cusolverEigMode_t vec = CUSOLVER_EIG_MODE_VECTOR;
    if (cusolverDnSetStream(c->solver, cs) != CUSOLVER_STATUS_SUCCESS ||
        cusolverDnSsyevd_bufferSize(c->solver, vec, lo, n, A, n, w, &lw32) != CUSOLVER_STATUS_SUCCESS) {
        return report(impl, pt_fail(msg, sizeof msg, PT_ERR_BACKEND, "cuda backend: cusolverDnSsyevd_bufferSize (n = %d) failed", n), msg);
    }
    cudaError_t e = cudaMallocAsync((void **)&V, nn * sizeof(float), cs);
    if (e == cudaSuccess) e = cudaMallocAsync((void **)&wv, (size_t)n * sizeof(float), cs);
    if (e == cudaSuccess) e = cudaMallocAsync((void **)&work, (size_t)lw32 * sizeof(float), cs);
    if (e == cudaSuccess) e = cudaMallocAsync((void **)&dinfo, 2 * sizeof(int), cs);
    if (e == cudaSuccess) e = cudaMemsetAsync(dinfo, 0, 2 * sizeof(int), cs);
    if (e == cudaSuccess) e = cudaMemcpyAsync(V, A, nn * sizeof(float), cudaMemcpyDeviceToDevice, cs);
    if (e != cudaSuccess) {
        rc = fail(impl, "cudaMallocAsync / cudaMemcpyAsync (eigh scratch)", e);
        goto out;
    }
    k_nonfinite<<<grid_for(impl, nn), kThreads, 0, cs>>>(A, nn, dinfo + 1);
    if (cusolverDnSsyevd(c->solver, vec, lo, n, V, n, wv, work, lw32, dinfo) != CUSOLVER_STATUS_SUCCESS) {
        rc = report(impl, pt_fail(msg, sizeof msg, PT_ERR_BACKEND, "cuda backend: cusolverDnSsyevd (n = %d) failed", n), msg);
        goto out;
    }
    {
        int h[2] = {0, 0};
        e = cudaMemcpyAsync(h, dinfo, sizeof h, cudaMemcpyDeviceToHost, cs);
        if (e == cudaSuccess) e = cudaStreamSynchronize(cs);
        if (e != cudaSuccess) {
            rc = fail(impl, "cudaStreamSynchronize (eigh info)", e);
            goto out;
        }
        info = h[0];
        bad = h[1];
    }
    if (!bad && info == 0) {
        k_eig_reorder<float><<<grid_for(impl, nn), kThreads, 0, cs>>>(V, wv, A, w, n);
    } else if (!bad) {
        /* fp32 did not converge: the input (A is untouched) in fp64 */
        e = cudaMallocAsync((void **)&Vd, nn * sizeof(double), cs);
        if (e == cudaSuccess) e = cudaMallocAsync((void **)&wd, (size_t)n * sizeof(double), cs);
        if (e != cudaSuccess) {
            rc = fail(impl, "cudaMallocAsync (eigh fp64 scratch)", e);
            goto out;
        }
        k_to_f64<<<grid_for(impl, nn), kThreads, 0, cs>>>(A, Vd, nn);
        if (cusolverDnDsyevd_bufferSize(c->solver, vec, lo, n, Vd, n, wd, &lw64) != CUSOLVER_STATUS_SUCCESS ||
            cudaMallocAsync((void **)&workd, (size_t)lw64 * sizeof(double), cs) != cudaSuccess ||
            cusolverDnDsyevd(c->solver, vec, lo, n, Vd, n, wd, workd, lw64, dinfo) != CUSOLVER_STATUS_SUCCESS ||
            cudaMemcpyAsync(&info, dinfo, sizeof info, cudaMemcpyDeviceToHost, cs) != cudaSuccess ||
            cudaStreamSynchronize(cs) != cudaSuccess) {
            (void)cudaGetLastError();
            rc = report(impl, pt_fail(msg, sizeof msg, PT_ERR_BACKEND, "cuda backend: cusolverDnDsyevd (n = %d, the fp64 retry) "
                                                                       "failed",
                                      n),
                        msg);
            goto out;
        }
        if (info == 0) k_eig_reorder<double><<<grid_for(impl, nn), kThreads, 0, cs>>>(Vd, wd, A, w, n);
        else bad = 1;
    }
    if (bad) {   /* non-finite input, or neither precision converged */
        k_fill_nan<<<grid_for(impl, nn), kThreads, 0, cs>>>(A, nn, status);
        k_fill_nan<<<1, kThreads, 0, cs>>>(w, (size_t)n, nullptr);
    }
out:
    if (V) (void)cudaFreeAsync(V, cs);
    if (wv) (void)cudaFreeAsync(wv, cs);
    if (work) (void)cudaFreeAsync(work, cs);
    if (Vd) (void)cudaFreeAsync(Vd, cs);
    if (wd) (void)cudaFreeAsync(wd, cs);
    if (workd) (void)cudaFreeAsync(workd, cs);
    if (dinfo) (void)cudaFreeAsync(dinfo, cs);
    if (rc) return rc;
    return finish(impl, "eigh", s);
}

int be_rekls_ew(void *impl, const pt_rekls_ew_args *a, pt_stream *s) {
    if (!a) return PT_ERR_INVALID_ARG;
    bool ok;
    switch (a->kind) {
    case PT_RK_GRAD_IN: ok = a->src && dtype_ok(a->src_dtype); break;
    case PT_RK_SCALE_COLS: ok = a->y && a->lam && a->cols > 0 && a->n % a->cols == 0; break;
    case PT_RK_LERP:
    case PT_RK_COPY:
    case PT_RK_AXPY: ok = a->y != nullptr; break;
    case PT_RK_ADAM: ok = a->m && a->v; break;
    case PT_RK_APPLY: ok = a->y && (!a->dst || dtype_ok(a->dst_dtype)); break;
    default: ok = false;
    }
    if (a->n && (!a->x || !ok)) return PT_ERR_INVALID_ARG;
    USE(impl);
    if (a->n == 0) return 0;
    k_rekls_ew<<<grid_for(impl, a->n), kThreads, 0, st(s)>>>(*a);
    return finish(impl, "rekls_ew kernel", s);
}
