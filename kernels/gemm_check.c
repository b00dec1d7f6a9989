/* kern_mm's checks, shared by the CPU and CUDA twins (one rule, one place):
 * operand and compute dtypes, the three shapes against the trans flags,
 * sizes that fit an int.  Violations are fatal and name the product. */
#include <limits.h>

#include "base/status.h"
#include "kernels/gemm.h"

static int as_int(int64_t v, const char *what, int idx) {
    MT_CHECK(v >= 0 && v <= INT_MAX, "kern_mm: product %d: %s = %lld is out of range [0, %d]", idx,
             what, (long long)v, INT_MAX);
    return (int)v;
}

static void check_dtype(mt_dtype_t dt, const char *name, int idx) {
    MT_CHECK(dt == MT_F32 || dt == MT_BF16, "kern_mm: product %d: %s has dtype %s (want F32 or BF16)",
             idx, name, mt_dtype_name(dt));
}

void kern_mm_dims(const kern_mm_t *p, int idx, int *M, int *N, int *K) {
    check_dtype(p->A.dtype, "A", idx);
    check_dtype(p->B.dtype, "B", idx);
    check_dtype(p->C.dtype, "C", idx);
    MT_CHECK(p->compute == MT_F32 || p->compute == MT_BF16,
             "kern_mm: product %d: compute %s is not supported (F32 or BF16)", idx,
             mt_dtype_name(p->compute));
    MT_CHECK(p->compute == MT_BF16 || (p->A.dtype == MT_F32 && p->B.dtype == MT_F32),
             "kern_mm: product %d: F32 compute needs F32 operands, got A %s and B %s (use BF16 "
             "compute for bf16 operands)",
             idx, mt_dtype_name(p->A.dtype), mt_dtype_name(p->B.dtype));
    const int64_t m = p->trans_a ? p->A.cols : p->A.rows, ka = p->trans_a ? p->A.rows : p->A.cols;
    const int64_t kb = p->trans_b ? p->B.cols : p->B.rows, n = p->trans_b ? p->B.rows : p->B.cols;
    MT_CHECK(ka == kb && p->C.rows == m && p->C.cols == n,
             "kern_mm: product %d: shapes do not match: C (%lld, %lld) = op(A) of A (%lld, %lld)%s "
             "@ op(B) of B (%lld, %lld)%s",
             idx, (long long)p->C.rows, (long long)p->C.cols, (long long)p->A.rows,
             (long long)p->A.cols, p->trans_a ? "^T" : "", (long long)p->B.rows,
             (long long)p->B.cols, p->trans_b ? "^T" : "");
    *M = as_int(m, "M", idx);
    *N = as_int(n, "N", idx);
    *K = as_int(ka, "K", idx);
    MT_CHECK(*M == 0 || *N == 0 || (p->C.data && (*K == 0 || (p->A.data && p->B.data))),
             "kern_mm: product %d: NULL data for a non-empty product (M=%d N=%d K=%d)", idx, *M, *N,
             *K);
}

