/* vec_math.h's functions as exported symbols, for the tests (test_cpu_vec_math.py) and for
 * callers that want a vectorised exp over a buffer. */
#include <stdint.h>

#include "vec_math.h"

/* y[i] = e^x[i] for i < n (x and y may be the same buffer). */
void deepinfer_vec_expf(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = x[i];
    expf_inplace(y, n);
}

/* This file's entry of the signature table (deepinfer_kernels/cpu/sources.py): the loader
 * compares the two and refuses the library when they differ. */
const char *deepinfer_abi_vec_math(void) { return "1|deepinfer_vec_expf(ppi)v"; }
