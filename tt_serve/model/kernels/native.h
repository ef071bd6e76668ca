/* What the C kernels of tt-serve's torch backend share: the headers, the bf16 rounding, and the
 * prototype of every function the library exports (native.py declares the same signatures to
 * ctypes; bump tt_native_abi with any change). The kernels themselves are in native.c (the
 * matrix products: the screened LM head and the fp32 projection) and native_layers.c (RMSNorm,
 * decode attention and the Gated DeltaNet layer); native.py compiles both into one library and
 * keys its cache by every source and this header. */
#ifndef TT_SERVE_NATIVE_H
#define TT_SERVE_NATIVE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/* x rounded to bf16 (nearest even), as fp32. */
static inline float tt_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return x; /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* native.c */
int tt_native_abi(void);
int tt_screen_levels(void);
void tt_screen_pack(const int8_t *w, int64_t vocab, int64_t hidden, int8_t *out);
void tt_screen_gemv(const uint8_t *qx, int64_t rows, const int8_t *packed, const int32_t *wsum,
                    const float *scales, int64_t vocab, int64_t hidden, int32_t zx, float sx,
                    float *out);
int tt_screen_best(const float *approx, int64_t rows, int64_t vocab, int64_t fine, int64_t n,
                   float *maxima, int64_t *best);
int64_t tt_screen_candidates(const float *approx, int64_t rows, int64_t vocab, int64_t fine,
                             const float *maxima, const float *floor_, const double *act,
                             const double *wgt, double w_norm, double err_norm, int32_t bf16,
                             const float *w_norms, const float *e_norms, const float *w_slice_max,
                             const float *e_slice_max, int64_t cap, int64_t *rows_out,
                             int64_t *cols_out, int64_t *counts);
int tt_linear_compiled(void);
int tt_linear_preferred(void);
void tt_linear_pack(const float *w, int64_t out, int64_t in, float *dst);
int tt_linear(const float *wb, const float *x, int64_t rows, int64_t out, int64_t in, float *y);
int tt_bfp_linear(const uint8_t *codes, const uint8_t *exps, int32_t bits, const float *x,
                  int64_t rows, int64_t out, int64_t in, float *y);

/* native_layers.c */
void tt_rms_norm(const void *x, const void *res, void *y_out, int64_t rows, int64_t n,
                 const float *scale, float eps, int32_t bf16, void *out);
int tt_attn_decode(const void *q, const void *k_pool, const void *v_pool, int64_t pool_blocks,
                   const int64_t *tables, int64_t width, const int64_t *lens, int64_t rows,
                   int64_t heads, int64_t kvh, int64_t bs, int64_t hd, float scale, int32_t bf16,
                   void *out);
int tt_gdn(const float *proj, int64_t stride, int64_t ntok, int64_t nseq, const int64_t *offsets,
           const int64_t *lens, const int64_t *slots, int64_t nslots, float *conv_state,
           const float *conv_w, int64_t taps, float *rec_state, const float *neg_a,
           const float *dt_bias, const float *norm_w, int64_t hk, int64_t hv, int64_t dk,
           int64_t dv, float eps, int32_t bf16, float *mixed, float *out);

#endif
