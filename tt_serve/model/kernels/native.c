/* CPU kernels of tt-serve's torch backend, compiled at first use by native.py with the machine's
 * own C compiler (-O3 -march=native -fopenmp) and called through ctypes on torch tensors'
 * memory. OpenMP resolves to the runtime torch has already loaded (one thread pool, sized by
 * torch.set_num_threads on the calling thread). Two kernels: the screened LM head's int8 GEMV
 * and one Gated DeltaNet layer between its projections (tt_gdn, further down).
 *
 * The int8 screen GEMV (screen.py): approximate logits a[r][j] = (sum_k (qx[r][k] - zx) w[j][k])
 * * (sx * s[j]) of u8 activations against an s8 weight. The integer sum is exact (int32), so a
 * logit carries three fp32 roundings: sx * s[j], the int32 -> fp32 conversion (exact below 2^24),
 * and the product. oneDNN's u8 x s8 GEMM computes the same, but at one row it reads the 63.5 MB
 * demo head at about 16 GB/s; this kernel streams it about twice as fast (2 cores, the GEMV
 * alone: 1.6-2.6 against 3.4-4.8 ms at 1 row, 2.8-4.4 against 4.7-6.4 ms at 8 rows; a whole
 * greedy pick 3.0 against 5.4 ms at 1 row, 5.3 against 7.1 at 8: python -m
 * bench.lm_head_layout). From about 16 rows oneDNN's blocked GEMM is faster (screen.py's
 * NATIVE_ROWS). With AVX512-VNNI (vpdpbusd: four u8 x s8 products summed into int32 lanes, no
 * saturation) it takes 8-bit activations; with AVX2 alone (vpmaddubsw + vpmaddwd) 7-bit ones,
 * where oneDNN's u8 x s8 GEMM reads the 0.8B model's 254 MB head at about 6.5 GB/s at one row.
 * tt_screen_levels() says which (255, 127, or 0: not compiled, nothing here is used). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
/* The largest u8 activation code tt_screen_gemv's integer sums are exact for: 255 with
 * AVX512-VNNI (vpdpbusd sums u8 x s8 products into int32, no saturation); 127 with AVX2
 * (vpmaddubsw sums pairs of products into int16, which no 7-bit x 8-bit pair can saturate:
 * 2 x 127 x 128 = 32,512 < 32,768; vpmaddwd then widens to int32); 0 without either (the
 * kernel is not compiled). */
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define TT_SCREEN_LEVELS 255
#elif defined(__AVX2__)
#define TT_SCREEN_LEVELS 127
#else
#define TT_SCREEN_LEVELS 0
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

/* The interface version native.py expects (bump it with any signature change). */
int tt_native_abi(void) { return 6; }

int tt_screen_levels(void) { return TT_SCREEN_LEVELS; }

/* w [vocab][hidden] s8 -> out [vocab / 16][hidden / 4][16][4]: for each block of 16 tokens and
 * each group of 4 hidden positions, the 4 bytes of each token, so one 64-byte load feeds one
 * vpdpbusd for 16 tokens at once (no horizontal sums); with AVX2 each 32-byte half (8 tokens)
 * feeds one vpmaddubsw + vpmaddwd. vocab % 16 == 0, hidden % 4 == 0. */
void tt_screen_pack(const int8_t *w, int64_t vocab, int64_t hidden, int8_t *out) {
    const int64_t groups = hidden / 4;
    for (int64_t b = 0; b < vocab / 16; b++)
        for (int64_t g = 0; g < groups; g++)
            for (int64_t t = 0; t < 16; t++)
                memcpy(out + ((b * groups + g) * 16 + t) * 4, w + (b * 16 + t) * hidden + g * 4, 4);
}

/* out [rows][vocab] fp32 = (qx [rows][hidden] u8 - zx) . packed weight * (sx * scales[j]);
 * wsum[j] = sum_k w[j][k] (int32) carries the zero point. Rows go four (AVX512) or two (AVX2)
 * at a time through each 16-token block while the block (hidden bytes x 16, 4 KB at hidden 256)
 * sits in L1. qx <= TT_SCREEN_LEVELS. */
void tt_screen_gemv(const uint8_t *qx, int64_t rows, const int8_t *packed, const int32_t *wsum,
                    const float *scales, int64_t vocab, int64_t hidden, int32_t zx, float sx,
                    float *out) {
#if TT_SCREEN_LEVELS == 255
    const int64_t groups = hidden / 4;
    const int64_t blocks = vocab / 16;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const int8_t *blk = packed + b * groups * 64;
        const __m512 sc = _mm512_mul_ps(_mm512_loadu_ps(scales + b * 16), _mm512_set1_ps(sx));
        const __m512i zero_point =
            _mm512_mullo_epi32(_mm512_loadu_si512(wsum + b * 16), _mm512_set1_epi32(zx));
        for (int64_t r0 = 0; r0 < rows; r0 += 4) {
            const int64_t n = rows - r0 < 4 ? rows - r0 : 4;
            const uint8_t *x = qx + r0 * hidden;
            __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(),
                              _mm512_setzero_si512(), _mm512_setzero_si512()};
            for (int64_t g = 0; g < groups; g++) {
                const __m512i wv = _mm512_loadu_si512(blk + g * 64);
                int32_t quad;
                memcpy(&quad, x + g * 4, 4);
                acc[0] = _mm512_dpbusd_epi32(acc[0], _mm512_set1_epi32(quad), wv);
                if (n > 1) {
                    memcpy(&quad, x + hidden + g * 4, 4);
                    acc[1] = _mm512_dpbusd_epi32(acc[1], _mm512_set1_epi32(quad), wv);
                }
                if (n > 2) {
                    memcpy(&quad, x + 2 * hidden + g * 4, 4);
                    acc[2] = _mm512_dpbusd_epi32(acc[2], _mm512_set1_epi32(quad), wv);
                }
                if (n > 3) {
                    memcpy(&quad, x + 3 * hidden + g * 4, 4);
                    acc[3] = _mm512_dpbusd_epi32(acc[3], _mm512_set1_epi32(quad), wv);
                }
            }
            for (int64_t i = 0; i < n; i++) {
                const __m512 v =
                    _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i], zero_point));
                _mm512_storeu_ps(out + (r0 + i) * vocab + b * 16, _mm512_mul_ps(v, sc));
            }
        }
    }
#elif TT_SCREEN_LEVELS == 127
    const int64_t groups = hidden / 4;
    const int64_t blocks = vocab / 16;
    const __m256i ones = _mm256_set1_epi16(1);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const int8_t *blk = packed + b * groups * 64;
        __m256 sc[2];
        __m256i zero_point[2];
        for (int h = 0; h < 2; h++) {
            sc[h] = _mm256_mul_ps(_mm256_loadu_ps(scales + b * 16 + h * 8), _mm256_set1_ps(sx));
            zero_point[h] = _mm256_mullo_epi32(
                _mm256_loadu_si256((const __m256i *)(wsum + b * 16 + h * 8)), _mm256_set1_epi32(zx));
        }
        for (int64_t r0 = 0; r0 < rows; r0 += 2) {
            const int two = rows - r0 > 1;
            const uint8_t *x = qx + r0 * hidden;
            /* a<row><half>: the int32 sums of 8 tokens each (named, so they stay in registers) */
            __m256i a00 = _mm256_setzero_si256(), a01 = a00, a10 = a00, a11 = a00;
            for (int64_t g = 0; g < groups; g++) {
                const __m256i w0 = _mm256_loadu_si256((const __m256i *)(blk + g * 64));
                const __m256i w1 = _mm256_loadu_si256((const __m256i *)(blk + g * 64 + 32));
                int32_t quad;
                memcpy(&quad, x + g * 4, 4);
                __m256i xv = _mm256_set1_epi32(quad);
                a00 = _mm256_add_epi32(a00, _mm256_madd_epi16(_mm256_maddubs_epi16(xv, w0), ones));
                a01 = _mm256_add_epi32(a01, _mm256_madd_epi16(_mm256_maddubs_epi16(xv, w1), ones));
                if (two) {
                    memcpy(&quad, x + hidden + g * 4, 4);
                    xv = _mm256_set1_epi32(quad);
                    a10 = _mm256_add_epi32(a10, _mm256_madd_epi16(_mm256_maddubs_epi16(xv, w0), ones));
                    a11 = _mm256_add_epi32(a11, _mm256_madd_epi16(_mm256_maddubs_epi16(xv, w1), ones));
                }
            }
            const __m256i acc[2][2] = {{a00, a01}, {a10, a11}};
            for (int64_t i = 0; i < 1 + two; i++)
                for (int h = 0; h < 2; h++) {
                    const __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[i][h], zero_point[h]));
                    _mm256_storeu_ps(out + (r0 + i) * vocab + b * 16 + h * 8, _mm256_mul_ps(v, sc[h]));
                }
        }
    }
#else
    (void)qx, (void)rows, (void)packed, (void)wsum, (void)scales;
    (void)vocab, (void)hidden, (void)zx, (void)sx, (void)out;
#endif
}

/* ------------------------------------------------------------------------------------------
 * fp32 projections y [rows][out] = x [rows][in] . wᵀ (layers.py ``Linear``) on AVX2 + FMA, for
 * a CPU without AVX512, where oneDNN's packed GEMM reads a decode step's weights at about 16 GB/s
 * and this kernel streams them at the memory's speed. Every output is one chain of FMAs over k
 * in ascending order from +0 (stored and reloaded between k-blocks, which is exact), whatever
 * the number of rows or their blocking: a row's result has the same bits alone, in a decode
 * batch or in a prefill chunk (what warm == cold needs of a projection).
 *
 * The weight is packed once, [out / 8][in][8]: eight outputs' weights of one k in one 32-byte
 * vector, so a decode row streams each block front to back. A micro-kernel takes up to six rows
 * and sixteen outputs (twelve accumulators, the 6x16 shape of BLIS's Haswell SGEMM); prefill
 * rows go in MC-row blocks over KC-wide k-blocks, x packed [6 rows interleaved] per block so
 * its broadcasts read one cache line, the weight's 16 x KC panel in L1 across the block.
 * out % 16 == 0 (``tt_linear`` returns 1 and writes nothing otherwise). */

int tt_linear_compiled(void) {
#if defined(__AVX2__) && defined(__FMA__)
    return 1;
#else
    return 0;
#endif
}

/* Where this kernel is the default (native.py): AVX2 + FMA without AVX512F. */
int tt_linear_preferred(void) {
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
    return 1;
#else
    return 0;
#endif
}

void tt_linear_pack(const float *w, int64_t out, int64_t in, float *dst) {
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < out / 8; b++)
        for (int64_t k = 0; k < in; k++)
            for (int j = 0; j < 8; j++) dst[(b * in + k) * 8 + j] = w[(b * 8 + j) * in + k];
}

#if defined(__AVX2__) && defined(__FMA__)
#define TT_MR 6
#define TT_KC 256
#define TT_MC 96
/* n (<= 6, a constant where inlined) rows x 16 outputs over kn steps of k: the row-i value of
 * step k at x[k * ldk + i * ldi], the weights at w0 / w1 [kn][8]; accumulates into y (row
 * stride ldy) unless ``first``. Named accumulators: an array of them is spilled by gcc. */
#define TT_LIN_ACC(i)                                                                             \
    __m256 c##i##0 = _mm256_setzero_ps(), c##i##1 = _mm256_setzero_ps();                          \
    if (n > i && !first) {                                                                        \
        c##i##0 = _mm256_loadu_ps(y + i * ldy);                                                   \
        c##i##1 = _mm256_loadu_ps(y + i * ldy + 8);                                               \
    }
#define TT_LIN_FMA(i)                                                                             \
    if (n > i) {                                                                                  \
        const __m256 xv = _mm256_broadcast_ss(xk + i * ldi);                                      \
        c##i##0 = _mm256_fmadd_ps(xv, u, c##i##0);                                                \
        c##i##1 = _mm256_fmadd_ps(xv, v, c##i##1);                                                \
    }
#define TT_LIN_OUT(i)                                                                             \
    if (n > i) {                                                                                  \
        _mm256_storeu_ps(y + i * ldy, c##i##0);                                                   \
        _mm256_storeu_ps(y + i * ldy + 8, c##i##1);                                               \
    }
static inline __attribute__((always_inline)) void
tt_lin_micro(const float *restrict w0, const float *restrict w1, const float *restrict x,
             int64_t ldk, int64_t ldi, float *restrict y, int64_t ldy, int64_t kn, int first,
             const int n) {
    TT_LIN_ACC(0) TT_LIN_ACC(1) TT_LIN_ACC(2) TT_LIN_ACC(3) TT_LIN_ACC(4) TT_LIN_ACC(5)
    const float *xk = x;
    for (int64_t k = 0; k < kn; k++, xk += ldk) {
        const __m256 u = _mm256_loadu_ps(w0 + k * 8), v = _mm256_loadu_ps(w1 + k * 8);
        TT_LIN_FMA(0) TT_LIN_FMA(1) TT_LIN_FMA(2) TT_LIN_FMA(3) TT_LIN_FMA(4) TT_LIN_FMA(5)
    }
    TT_LIN_OUT(0) TT_LIN_OUT(1) TT_LIN_OUT(2) TT_LIN_OUT(3) TT_LIN_OUT(4) TT_LIN_OUT(5)
}

static void tt_lin_rows(const float *w0, const float *w1, const float *x, int64_t ldk,
                        int64_t ldi, float *y, int64_t ldy, int64_t kn, int first, int64_t n) {
    switch (n) {
    case 1: tt_lin_micro(w0, w1, x, ldk, ldi, y, ldy, kn, first, 1); break;
    case 2: tt_lin_micro(w0, w1, x, ldk, ldi, y, ldy, kn, first, 2); break;
    case 3: tt_lin_micro(w0, w1, x, ldk, ldi, y, ldy, kn, first, 3); break;
    case 4: tt_lin_micro(w0, w1, x, ldk, ldi, y, ldy, kn, first, 4); break;
    case 5: tt_lin_micro(w0, w1, x, ldk, ldi, y, ldy, kn, first, 5); break;
    default: tt_lin_micro(w0, w1, x, ldk, ldi, y, ldy, kn, first, 6); break;
    }
}
#endif

int tt_linear(const float *wb, const float *x, int64_t rows, int64_t out, int64_t in, float *y) {
#if defined(__AVX2__) && defined(__FMA__)
    if (out % 16 != 0 || rows < 0 || in < 1) return 1;
    if (rows == 0) return 0;
    const int64_t panels = out / 16;
    if (rows <= TT_MR) { /* decode: x as it lies, one pass over the weight */
#pragma omp parallel for schedule(static)
        for (int64_t p = 0; p < panels; p++) {
            const float *w0 = wb + 2 * p * in * 8;
            tt_lin_rows(w0, w0 + in * 8, x, 1, in, y + p * 16, out, in, 1, rows);
        }
        return 0;
    }
    float *xp = malloc(sizeof(float) * TT_MC * TT_KC);
    if (xp == NULL) return 1;
#pragma omp parallel
    for (int64_t k0 = 0; k0 < in; k0 += TT_KC) {
        const int64_t kn = in - k0 < TT_KC ? in - k0 : TT_KC;
        for (int64_t m0 = 0; m0 < rows; m0 += TT_MC) {
            const int64_t mn = rows - m0 < TT_MC ? rows - m0 : TT_MC;
            /* x[m0 + g + i][k0 + k] -> xp[g][k][i], groups of six rows (the last zero-padded) */
#pragma omp for schedule(static)
            for (int64_t g = 0; g < mn; g += TT_MR)
                for (int64_t k = 0; k < kn; k++)
                    for (int64_t i = 0; i < TT_MR; i++)
                        xp[g * kn + k * TT_MR + i] = g + i < mn ? x[(m0 + g + i) * in + k0 + k] : 0.0f;
#pragma omp for schedule(static)
            for (int64_t p = 0; p < panels; p++) {
                const float *w0 = wb + 2 * p * in * 8 + k0 * 8;
                for (int64_t g = 0; g < mn; g += TT_MR)
                    tt_lin_rows(w0, w0 + in * 8, xp + g * kn, TT_MR, 1, y + (m0 + g) * out + p * 16,
                                out, kn, k0 == 0, mn - g < TT_MR ? mn - g : TT_MR);
            }
        }
    }
    free(xp);
    return 0;
#else
    (void)wb, (void)x, (void)rows, (void)out, (void)in, (void)y;
    return 1;
#endif
}

/* ------------------------------------------------------------------------------------------
 * Qwen3.5's RMSNorm (layers.py ``rms_norm``) of rows of n values, optionally after the residual
 * add: y = x + res (rounded to the dtype, written to y_out), out = (y * rsqrt(mean(y²) + eps))
 * * scale, the product rounded to fp32 then, times the fp32 scale (1 + w), to the dtype. fp32, or
 * bf16 (``bf16``: uint16 storage) for x, res, y_out and out; scale is fp32. Each row alone: its
 * bits never depend on the other rows of the call. */

static inline float tt_load(const void *p, int64_t i, int32_t bf16) {
    if (!bf16) return ((const float *)p)[i];
    const uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline void tt_store(void *p, int64_t i, float v, int32_t bf16) {
    if (!bf16) {
        ((float *)p)[i] = v;
        return;
    }
    v = tt_bf16(v);
    uint32_t u;
    memcpy(&u, &v, 4);
    ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
}

void tt_rms_norm(const void *x, const void *res, void *y_out, int64_t rows, int64_t n,
                 const float *scale, float eps, int32_t bf16, void *out) {
#pragma omp parallel for schedule(static) if (rows * n >= 65536)
    for (int64_t r = 0; r < rows; r++) {
        float y[n];
        float ss = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            float v = tt_load(x, r * n + j, bf16);
            if (res != NULL) {
                v = v + tt_load(res, r * n + j, bf16);
                if (bf16) v = tt_bf16(v);
                tt_store(y_out, r * n + j, v, bf16);
            }
            y[j] = v;
            ss += v * v;
        }
        const float inv = 1.0f / sqrtf(ss / (float)n + eps);
        for (int64_t j = 0; j < n; j++) tt_store(out, r * n + j, (y[j] * inv) * scale[j], bf16);
    }
}

/* ------------------------------------------------------------------------------------------
 * Decode attention over the paged KV (attention.py ``attend`` for single-token rows), reading
 * the blocks where they lie: no gathered copy of a row's history (31 MB a step at 30k tokens on
 * the demo model). Row b's query heads [heads][hd] attend to its first lens[b] positions, the
 * blocks tables[b][0..]; a kv head serves heads / kvh query heads. The torch form's roundings:
 * for bf16 the scores and the probabilities are rounded to bf16 before their products, and the
 * output at the end; softmax in fp32. Returns 1 (nothing written) when a table entry or a
 * length leaves the pool or the table. */

#if defined(__AVX512F__)
static inline __m512 tt_load16(const void *p, int64_t i, int32_t bf16) {
    if (!bf16) return _mm512_loadu_ps((const float *)p + i);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

int tt_attn_decode(const void *q, const void *k_pool, const void *v_pool, int64_t pool_blocks,
                   const int64_t *tables, int64_t width, const int64_t *lens, int64_t rows,
                   int64_t heads, int64_t kvh, int64_t bs, int64_t hd, float scale, int32_t bf16,
                   void *out) {
    for (int64_t b = 0; b < rows; b++) {
        if (lens[b] < 1 || lens[b] > width * bs) return 1;
        for (int64_t j = 0; j < (lens[b] + bs - 1) / bs; j++)
            if (tables[b * width + j] < 0 || tables[b * width + j] >= pool_blocks) return 1;
    }
    const int64_t rep = heads / kvh;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < rows; b++)
        for (int64_t g = 0; g < kvh; g++) {
            const int64_t len = lens[b];
            float *sc = malloc(sizeof(float) * rep * len);
            float qv[rep][hd], acc[rep][hd];
            if (sc == NULL) continue; /* leaves the output unwritten; cannot happen in practice */
            for (int64_t r = 0; r < rep; r++)
                for (int64_t i = 0; i < hd; i++) {
                    qv[r][i] = tt_load(q, (b * heads + g * rep + r) * hd + i, bf16);
                    acc[r][i] = 0.0f;
                }
            for (int64_t t = 0; t < len; t++) {
                const int64_t blk = tables[b * width + t / bs];
                const int64_t at = ((blk * kvh + g) * bs + t % bs) * hd;
                for (int64_t r = 0; r < rep; r++) {
                    float dot = 0.0f;
#if defined(__AVX512F__)
                    if (hd % 16 == 0) {
                        __m512 a = _mm512_setzero_ps();
                        for (int64_t i = 0; i < hd; i += 16)
                            a = _mm512_fmadd_ps(_mm512_loadu_ps(qv[r] + i), tt_load16(k_pool, at + i, bf16), a);
                        dot = _mm512_reduce_add_ps(a);
                    } else
#endif
                        for (int64_t i = 0; i < hd; i++) dot += qv[r][i] * tt_load(k_pool, at + i, bf16);
                    sc[r * len + t] = bf16 ? tt_bf16(tt_bf16(dot) * scale) : dot * scale;
                }
            }
            for (int64_t r = 0; r < rep; r++) {
                float *s = sc + r * len;
                float m = s[0], sum = 0.0f;
                for (int64_t t = 1; t < len; t++) m = s[t] > m ? s[t] : m;
                for (int64_t t = 0; t < len; t++) {
                    s[t] = expf(s[t] - m);
                    sum += s[t];
                }
                const float inv = 1.0f / sum;
                for (int64_t t = 0; t < len; t++) s[t] = bf16 ? tt_bf16(s[t] * inv) : s[t] * inv;
            }
            for (int64_t t = 0; t < len; t++) {
                const int64_t blk = tables[b * width + t / bs];
                const int64_t at = ((blk * kvh + g) * bs + t % bs) * hd;
                for (int64_t r = 0; r < rep; r++) {
                    const float p = sc[r * len + t];
#if defined(__AVX512F__)
                    if (hd % 16 == 0) {
                        const __m512 pv = _mm512_set1_ps(p);
                        for (int64_t i = 0; i < hd; i += 16)
                            _mm512_storeu_ps(acc[r] + i, _mm512_fmadd_ps(pv, tt_load16(v_pool, at + i, bf16),
                                                                         _mm512_loadu_ps(acc[r] + i)));
                    } else
#endif
                        for (int64_t i = 0; i < hd; i++) acc[r][i] += p * tt_load(v_pool, at + i, bf16);
                }
            }
            for (int64_t r = 0; r < rep; r++)
                for (int64_t i = 0; i < hd; i++)
                    tt_store(out, (b * heads + g * rep + r) * hd + i, acc[r][i], bf16);
            free(sc);
        }
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * The screen's search (screen.py ``_chunk``) over approximate logits a [rows][vocab] cut into
 * slices of ``fine`` tokens, row by row in parallel: what the torch path does in some forty
 * small ops, and its results bit for bit (the thresholds are the same fp32 expressions:
 * compiled as ISO C, nothing is contracted into an FMA).
 *
 * tt_screen_best: each row's slice maxima, and n tokens with the largest a by descending a
 * (ties either way): the n slices with the largest maxima hold them (screen.py's ``largest``). */

typedef struct {
    float v;
    int64_t i;
} tt_pair;

/* Moves the k largest of p[0..len) to its front (any order): quickselect, middle pivot. */
static void tt_top_k(tt_pair *p, int64_t len, int64_t k) {
    int64_t lo = 0, hi = len - 1;
    while (lo < hi && k > lo && k <= hi) {
        const float pivot = p[lo + (hi - lo) / 2].v;
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (p[i].v > pivot) i++;
            while (p[j].v < pivot) j--;
            if (i <= j) {
                const tt_pair t = p[i];
                p[i++] = p[j];
                p[j--] = t;
            }
        }
        /* [lo, j] >= pivot >= [i, hi] */
        if (k <= j + 1) hi = j;
        else if (k >= i) lo = i;
        else return;
    }
}

static int tt_descending(const void *a, const void *b) {
    const float x = ((const tt_pair *)a)->v, y = ((const tt_pair *)b)->v;
    return (x < y) - (x > y);
}

static float tt_slice_max(const float *x, int64_t n) {
    int64_t i = 0;
    float m = x[0];
#if defined(__AVX512F__)
    if (n >= 16) {
        __m512 acc = _mm512_loadu_ps(x);
        for (i = 16; i + 16 <= n; i += 16) acc = _mm512_max_ps(acc, _mm512_loadu_ps(x + i));
        m = _mm512_reduce_max_ps(acc);
    }
#endif
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

int tt_screen_best(const float *approx, int64_t rows, int64_t vocab, int64_t fine, int64_t n,
                   float *maxima, int64_t *best) {
    const int64_t per = vocab / fine;
    if (fine < 1 || vocab % fine || n < 1 || n > per) return 1;
    int bad = 0;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t s = 0; s < per; s++)
            maxima[r * per + s] = tt_slice_max(approx + r * vocab + s * fine, fine);
#pragma omp parallel for schedule(static) reduction(| : bad)
    for (int64_t r = 0; r < rows; r++) {
        const float *a = approx + r * vocab;
        const float *mx = maxima + r * per;
        tt_pair *sl = malloc(sizeof(tt_pair) * (per > n * fine ? per : n * fine));
        if (sl == NULL) {
            bad = 1;
            continue;
        }
        for (int64_t s = 0; s < per; s++) sl[s] = (tt_pair){mx[s], s};
        tt_top_k(sl, per, n);
        /* the entries of the n chosen slices, then their n largest */
        tt_pair *e = malloc(sizeof(tt_pair) * n * fine);
        if (e == NULL) {
            free(sl);
            bad = 1;
            continue;
        }
        for (int64_t j = 0; j < n; j++)
            for (int64_t c = 0; c < fine; c++) {
                const int64_t t = sl[j].i * fine + c;
                e[j * fine + c] = (tt_pair){a[t], t};
            }
        tt_top_k(e, n * fine, n);
        qsort(e, n, sizeof(tt_pair), tt_descending);
        for (int64_t j = 0; j < n; j++) best[r * n + j] = e[j].i;
        free(e);
        free(sl);
    }
    return bad ? 2 : 0;
}

/* fp64 -> fp32 rounded up (screen.py's ``_up32``). */
static float tt_up32(double d) {
    float f = (float)d;
    return (double)f < d ? nextafterf(f, INFINITY) : f;
}

/* Every (row, token) with a >= floor - B: the slices whose maximum reaches the slice's largest
 * bound, then each of their entries against its own token's bound; row-major, tokens
 * ascending, into rows_out / cols_out (the candidates of rows with more than ``cap`` are left
 * out; counts[r] is every row's full count). Returns the number written. */
int64_t tt_screen_candidates(const float *approx, int64_t rows, int64_t vocab, int64_t fine,
                             const float *maxima, const float *floor_, const double *act,
                             const double *wgt, double w_norm, double err_norm, int32_t bf16,
                             const float *w_norms, const float *e_norms, const float *w_slice_max,
                             const float *e_slice_max, int64_t cap, int64_t *rows_out,
                             int64_t *cols_out, int64_t *counts) {
    const int64_t per = vocab / fine;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const double fd = (double)floor_[r];
        double margin = 8 * 0x1p-24 * (fabs(fd) + act[r] * w_norm + wgt[r] * err_norm);
        if (bf16) margin = margin + 0x1p-8 * fabs(fd);
        const float floor32 = floor_[r] - tt_up32(margin);
        const float act32 = tt_up32(act[r]), wgt32 = tt_up32(wgt[r]);
        const float *a = approx + r * vocab;
        int64_t count = 0;
        int64_t *cols = cols_out + r * cap;
        for (int64_t s = 0; s < per; s++) {
            const float reach = floor32 - (act32 * w_slice_max[s] + wgt32 * e_slice_max[s]);
            if (!(maxima[r * per + s] >= reach)) continue;
            for (int64_t c = s * fine; c < (s + 1) * fine; c++) {
                const float thr = floor32 - (act32 * w_norms[c] + wgt32 * e_norms[c]);
                if (a[c] >= thr) {
                    if (count < cap) cols[count] = c;
                    count++;
                }
            }
        }
        counts[r] = count;
    }
    int64_t out = 0; /* compact: row r's entries move left to their place */
    for (int64_t r = 0; r < rows; r++) {
        if (counts[r] > cap) continue;
        memmove(cols_out + out, cols_out + r * cap, sizeof(int64_t) * counts[r]);
        for (int64_t j = 0; j < counts[r]; j++) rows_out[out + j] = r;
        out += counts[r];
    }
    return out;
}

/* ------------------------------------------------------------------------------------------
 * One Gated DeltaNet layer between its two projections (gdn.py), for every sequence of a step:
 * the causal depthwise conv with SiLU, the q/k L2 norms, the gates, the delta rule token by
 * token, and the gated RMS norm, in place on each sequence's conv and recurrent state slots.
 *
 * Per token t and v-head h (k-head h / (hv / hk)), with q̂ = q / ||q|| * dk^-1/2, k̂ = k / ||k||,
 * d = exp(g):
 *     u = (v - d Sᵀk̂) * beta;  S <- d S + k̂ ⊗ u;  o = Sᵀq̂;  out = w * rmsnorm(o) * silu(z)
 * the recurrent form of the rule, which reads the state twice per token (Sᵀk̂, then the update
 * fused with Sᵀq̂) and writes it once; at dk = dv = 64 a head's state is 16 KB and stays in L1.
 * It carries the state across any cut of a sequence bit for bit (token by token, fp32 state),
 * so how a prompt is split into chunks changes nothing.
 * ``bf16``: the roundings a bf16 model's torch path makes (beta, the core output and the norm's
 * two products rounded to bf16), so the result is that path's to summation order.
 *
 * proj [T][stride]: the fused in-projection's rows, qkv (conv_dim = 2 hk dk + hv dv channels)
 * | z (hv dv) | b (hv) | a (hv). Sequence i is rows offsets[i] .. + lens[i] with state slot
 * slots[i] (1 when a sequence leaves [0, ntok) or [0, nslots): nothing is written);
 * conv_state [S][conv_dim][K-1] (oldest input first), conv_w [K][conv_dim] (tap major),
 * rec_state [S][hv][dk][dv]; mixed [T][conv_dim] scratch; out [T][hv dv]. */

#if defined(__AVX512F__)
#define TT_AVX512 1
/* e^x on 16 lanes: Cephes' expf (a degree-6 polynomial on [-ln2/2, ln2/2], about 1 ulp),
 * scaled by 2^n with vscalefps (which saturates to 0 and inf); NaN passes through. */
static inline __m512 tt_exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_set1_ps(88.7f), x); /* the second operand is kept when NaN */
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}
#else
#define TT_AVX512 0
#endif

/* x / (1 + e^-x) in place on n floats. */
static void tt_silu_inplace(float *x, int64_t n) {
    int64_t i = 0;
#if TT_AVX512
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        const __m512 e = tt_exp16(_mm512_sub_ps(_mm512_setzero_ps(), v));
        _mm512_storeu_ps(x + i, _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), e)));
    }
#endif
    for (; i < n; i++) x[i] = x[i] / (1.0f + expf(-x[i]));
}

/* The delta rule for one token of one head on its state s [dk][dv]; o receives Sᵀq̂. */
#if TT_AVX512
/* NV = dv / 16 vectors per state row, a constant so the accumulators stay in registers. */
#define TT_DELTA_AVX512(NV)                                                                       \
    static void tt_delta_token_##NV(float *restrict s, const float *restrict qn,                 \
                                    const float *restrict kn, const float *restrict v,           \
                                    float decay, float beta, int64_t dk, float *restrict o) {    \
        __m512 acc[NV], u[NV];                                                                   \
        for (int c = 0; c < NV; c++) acc[c] = _mm512_setzero_ps();                               \
        for (int64_t i = 0; i < dk; i++) {                                                       \
            const __m512 ki = _mm512_set1_ps(kn[i]);                                             \
            for (int c = 0; c < NV; c++)                                                         \
                acc[c] = _mm512_fmadd_ps(_mm512_loadu_ps(s + i * NV * 16 + c * 16), ki, acc[c]); \
        }                                                                                        \
        const __m512 d = _mm512_set1_ps(decay), b = _mm512_set1_ps(beta);                        \
        for (int c = 0; c < NV; c++) {                                                           \
            u[c] = _mm512_mul_ps(_mm512_fnmadd_ps(d, acc[c], _mm512_loadu_ps(v + c * 16)), b);   \
            acc[c] = _mm512_setzero_ps();                                                        \
        }                                                                                        \
        for (int64_t i = 0; i < dk; i++) {                                                       \
            const __m512 ki = _mm512_set1_ps(kn[i]), qi = _mm512_set1_ps(qn[i]);                 \
            for (int c = 0; c < NV; c++) {                                                       \
                float *row = s + i * NV * 16 + c * 16;                                           \
                const __m512 r =                                                                 \
                    _mm512_fmadd_ps(ki, u[c], _mm512_mul_ps(_mm512_loadu_ps(row), d));           \
                _mm512_storeu_ps(row, r);                                                        \
                acc[c] = _mm512_fmadd_ps(r, qi, acc[c]);                                         \
            }                                                                                    \
        }                                                                                        \
        for (int c = 0; c < NV; c++) _mm512_storeu_ps(o + c * 16, acc[c]);                       \
    }
TT_DELTA_AVX512(4)
TT_DELTA_AVX512(8)
#endif

static void tt_delta_token(float *restrict s, const float *restrict qn, const float *restrict kn,
                           const float *restrict v, float decay, float beta, int64_t dk,
                           int64_t dv, float *restrict o, float *restrict u) {
#if TT_AVX512
    if (dv == 64) return tt_delta_token_4(s, qn, kn, v, decay, beta, dk, o);
    if (dv == 128) return tt_delta_token_8(s, qn, kn, v, decay, beta, dk, o);
#endif
    for (int64_t j = 0; j < dv; j++) o[j] = 0.0f;
    for (int64_t i = 0; i < dk; i++)
        for (int64_t j = 0; j < dv; j++) o[j] += s[i * dv + j] * kn[i];
    for (int64_t j = 0; j < dv; j++) {
        u[j] = (v[j] - decay * o[j]) * beta;
        o[j] = 0.0f;
    }
    for (int64_t i = 0; i < dk; i++)
        for (int64_t j = 0; j < dv; j++) {
            const float r = s[i * dv + j] * decay + kn[i] * u[j];
            s[i * dv + j] = r;
            o[j] += r * qn[i];
        }
}

/* One v-head of one sequence, token by token; z is silu'd in ``gate`` [len][dv] scratch. */
static void tt_gdn_head(const float *proj, int64_t stride, int64_t off, int64_t len, float *s,
                        const float *mixed, int64_t conv_dim, const float *neg_a,
                        const float *dt_bias, const float *norm_w, int64_t h, int64_t hk,
                        int64_t hv, int64_t dk, int64_t dv, float eps, int32_t bf16, float *out) {
    const int64_t kh = h / (hv / hk);
    const float scale = 1.0f / sqrtf((float)dk);
    float qn[dk], kn[dk], o[dv], u[dv], gate[dv];
    for (int64_t t = off; t < off + len; t++) {
        const float *m = mixed + t * conv_dim;
        const float *q = m + kh * dk, *k = m + hk * dk + kh * dk, *v = m + 2 * hk * dk + h * dv;
        float qq = 0.0f, kk = 0.0f;
        for (int64_t i = 0; i < dk; i++) {
            qq += q[i] * q[i];
            kk += k[i] * k[i];
        }
        const float rq = 1.0f / sqrtf(qq + 1e-6f), rk = 1.0f / sqrtf(kk + 1e-6f);
        for (int64_t i = 0; i < dk; i++) {
            qn[i] = (q[i] * rq) * scale;
            kn[i] = k[i] * rk;
        }
        const float *row = proj + t * stride;
        const float b = row[conv_dim + hv * dv + h], a = row[conv_dim + hv * dv + hv + h];
        float beta = 1.0f / (1.0f + expf(-b));
        if (bf16) beta = tt_bf16(beta);
        const float x = a + dt_bias[h];
        const float decay = expf(neg_a[h] * (x > 20.0f ? x : log1pf(expf(x))));
        tt_delta_token(s, qn, kn, v, decay, beta, dk, dv, o, u);
        float ss = 0.0f;
        for (int64_t j = 0; j < dv; j++) {
            if (bf16) o[j] = tt_bf16(o[j]);
            ss += o[j] * o[j];
        }
        const float r = 1.0f / sqrtf(ss / (float)dv + eps);
        memcpy(gate, row + conv_dim + h * dv, dv * sizeof(float));
        tt_silu_inplace(gate, dv);
        float *dst = out + t * hv * dv + h * dv;
        for (int64_t j = 0; j < dv; j++) {
            const float n = o[j] * r;
            const float wn = bf16 ? tt_bf16(norm_w[j] * tt_bf16(n)) : norm_w[j] * n;
            dst[j] = bf16 ? tt_bf16(wn * gate[j]) : wn * gate[j];
        }
    }
}

/* The causal conv (taps summed in ascending order) and SiLU of channels [c0, c1) of one
 * sequence, then its history: the last K-1 inputs. */
static void tt_conv_block(const float *proj, int64_t stride, int64_t off, int64_t n, float *st,
                          const float *conv_w, int64_t taps, int64_t conv_dim, int64_t c0,
                          int64_t c1, float *mixed) {
    const int64_t hist = taps - 1, w = c1 - c0;
    float old[hist > 0 ? hist : 1][w]; /* the history, tap-major */
    for (int64_t j = 0; j < hist; j++)
        for (int64_t c = 0; c < w; c++) old[j][c] = st[(c0 + c) * hist + j];
    for (int64_t t = 0; t < n; t++) {
        float *dst = mixed + (off + t) * conv_dim + c0;
        for (int64_t j = 0; j < taps; j++) {
            const int64_t f = t + j; /* index into [history | inputs] */
            const float *x = f < hist ? old[f] : proj + (off + f - hist) * stride + c0;
            const float *wj = conv_w + j * conv_dim + c0;
            if (j == 0)
                for (int64_t c = 0; c < w; c++) dst[c] = x[c] * wj[c];
            else
                for (int64_t c = 0; c < w; c++) dst[c] += x[c] * wj[c];
        }
        tt_silu_inplace(dst, w);
    }
    for (int64_t j = 0; j < hist; j++) {
        const int64_t f = n + j;
        for (int64_t c = 0; c < w; c++)
            st[(c0 + c) * hist + j] = f < hist ? old[f][c] : proj[(off + f - hist) * stride + c0 + c];
    }
}

int tt_gdn(const float *proj, int64_t stride, int64_t ntok, int64_t nseq, const int64_t *offsets,
           const int64_t *lens, const int64_t *slots, int64_t nslots, float *conv_state,
           const float *conv_w, int64_t taps, float *rec_state, const float *neg_a,
           const float *dt_bias, const float *norm_w, int64_t hk, int64_t hv, int64_t dk,
           int64_t dv, float eps, int32_t bf16, float *mixed, float *out) {
    const int64_t conv_dim = 2 * hk * dk + hv * dv;
    const int64_t cblock = 128;
    const int64_t nblocks = (conv_dim + cblock - 1) / cblock;
    for (int64_t i = 0; i < nseq; i++) /* every write lands in a given slot and row, or none */
        if (offsets[i] < 0 || lens[i] < 1 || offsets[i] + lens[i] > ntok || slots[i] < 0 ||
            slots[i] >= nslots)
            return 1;
#pragma omp parallel
    {
#pragma omp for collapse(2) schedule(static)
        for (int64_t i = 0; i < nseq; i++)
            for (int64_t cb = 0; cb < nblocks; cb++) {
                const int64_t c0 = cb * cblock;
                tt_conv_block(proj, stride, offsets[i], lens[i],
                              conv_state + slots[i] * conv_dim * (taps - 1), conv_w, taps,
                              conv_dim, c0, c0 + cblock < conv_dim ? c0 + cblock : conv_dim, mixed);
            }
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int64_t i = 0; i < nseq; i++)
            for (int64_t h = 0; h < hv; h++)
                tt_gdn_head(proj, stride, offsets[i], lens[i],
                            rec_state + (slots[i] * hv + h) * dk * dv, mixed, conv_dim, neg_a,
                            dt_bias, norm_w, h, hk, hv, dk, dv, eps, bf16, out);
    }
    return 0;
}
