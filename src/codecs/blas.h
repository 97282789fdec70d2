/* blas.h - internal: the BLAS and LAPACK routines of the transform stage
 * and of calibration (cblas_sgemm, cblas_dsyrk, LAPACK's dsyevd), taken
 * from OpenBLAS (libopenblas.so.0) with dlopen on first use rather than
 * linked.
 *
 * Why not linked: OpenBLAS starts its thread pool (a thread per CPU but
 * one) as soon as it is loaded, so every process that linked kvserde had
 * those threads, and their spinning at start, whether or not it ever used
 * a transform (bench_lossless's profiles showed them; on a 64-core
 * inference server it would be 63 threads). Loaded here, only a process
 * that codes with a transform or calibrates one starts them. The library is
 * never unloaded. */
#ifndef KVSERDE_CODECS_BLAS_H
#define KVSERDE_CODECS_BLAS_H

#include <cblas.h>

typedef void (*kvs_sgemm_fn)(const enum CBLAS_ORDER, const enum CBLAS_TRANSPOSE,
                             const enum CBLAS_TRANSPOSE, const blasint, const blasint,
                             const blasint, const float, const float *, const blasint,
                             const float *, const blasint, const float, float *, const blasint);
typedef void (*kvs_dsyrk_fn)(const enum CBLAS_ORDER, const enum CBLAS_UPLO,
                             const enum CBLAS_TRANSPOSE, const blasint, const blasint,
                             const double, const double *, const blasint, const double,
                             double *, const blasint);
typedef void (*kvs_dsyevd_fn)(const char *jobz, const char *uplo, const int *n, double *a,
                              const int *lda, double *w, double *work, const int *lwork,
                              int *iwork, const int *liwork, int *info);

typedef struct kvs_blas {
    kvs_sgemm_fn sgemm;
    kvs_dsyrk_fn dsyrk;
    kvs_dsyevd_fn dsyevd; /* LAPACK dsyevd_ */
} kvs_blas;

/* The routines, loaded once (thread-safe). Refused: KVS_EUNSUPPORTED,
 * "<who>: OpenBLAS (libopenblas.so.0) cannot be loaded: <the loader's
 * reason>" (or a routine it lacks). Tests may swap an entry of *out (the
 * table is not const underneath) while no transform runs. */
int kvs_blas_get(const char *who, const kvs_blas **out);

#endif /* KVSERDE_CODECS_BLAS_H */
