/* CPU kernels of tt-serve's torch backend, compiled at first use by native.py with the machine's
 * own C compiler (-O3 -march=native -fopenmp) and called through ctypes on torch tensors'
 * memory. OpenMP resolves to the runtime torch has already loaded (one thread pool, sized by
 * torch.set_num_threads on the calling thread). The library is built from two sources: this one,
 * the matrix products (the interface version, the screened LM head's int8 GEMV and its search
 * over the approximate logits, and the fp32 projection kernel), and native_layers.c, the kernels
 * of a layer's body (RMSNorm, decode attention, one Gated DeltaNet layer between its
 * projections); native.h holds what they share and every exported function's prototype.
 *
 * The int8 screen GEMV (screen.py): approximate logits a[r][j] = (sum_k (qx[r][k] - zx) w[j][k])
 * * (sx * s[j]) of u8 activations against an s8 weight. The integer sum is exact (int32), so a
 * logit carries three fp32 roundings: sx * s[j], the int32 -> fp32 conversion (exact below 2^24),
 * and the product. oneDNN's u8 x s8 GEMM computes the same, but at one row it reads the 63.5 MB
 * demo head at about 16 GB/s; this kernel streams it about twice as fast (2 cores, the GEMV
 * alone: 1.6-2.6 against 3.4-4.8 ms at 1 row, 2.8-4.4 against 4.7-6.4 ms at 8 rows; a whole
 * greedy pick 3.0 against 5.4 ms at 1 row, 5.3 against 7.1 at 8: python -m
 * bench.kernels.lm_head_layout). From about 16 rows oneDNN's blocked GEMM is faster (screen.py's
 * NATIVE_ROWS). With AVX512-VNNI (vpdpbusd: four u8 x s8 products summed into int32 lanes, no
 * saturation) it takes 8-bit activations; with AVX2 alone (vpmaddubsw + vpmaddwd) 7-bit ones,
 * where oneDNN's u8 x s8 GEMM reads the 0.8B model's 254 MB head at about 6.5 GB/s at one row.
 * tt_screen_levels() says which (255, 127, or 0: not compiled, nothing here is used). */
#include "native.h"

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

/* The interface version native.py expects (bump it with any signature change). */
int tt_native_abi(void) { return 7; }

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
/* row i's value at ``at`` times the 16 weights u | v, into row i's accumulators */
#define TT_FMA(i, at)                                                                             \
    if (n > i) {                                                                                  \
        const __m256 xv = _mm256_broadcast_ss(at);                                                \
        c##i##0 = _mm256_fmadd_ps(xv, u, c##i##0);                                                \
        c##i##1 = _mm256_fmadd_ps(xv, v, c##i##1);                                                \
    }
#define TT_LIN_FMA(i) TT_FMA(i, xk + i * ldi)
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
 * Block-float projections: y [rows][out] = x [rows][in] . wᵀ on a weight held as the card holds
 * it in bfloat8_b or bfloat4_b (model/blockfloat.py packs it): the card's weight is [in, out]
 * TILE, so one shared exponent covers 16 consecutive outputs at one k. Packed [out / 16][in]:
 * per (panel, k) the 16 outputs' sign-magnitude codes (bfloat8_b: 16 bytes, sign | 7-bit
 * magnitude; bfloat4_b: 8 bytes, byte j holding outputs j (low nibble) and j + 8, sign | 3-bit
 * magnitude) and in ``exps`` [out / 16][in] their shared exponent e: a value reads back as
 * magnitude x 2^(e - 127 - (bits - 1)). ``bits`` is the magnitude width: 7 or 3.
 *
 * The sums are tt_linear's: each output one FMA chain over k ascending from +0. A decode row
 * multiplies x_k by the block's power-of-two unit (exact) and that by the integer magnitude
 * in the FMA, whose product is x_k . w_k exactly, so the result has the bits of tt_linear on
 * the unpacked weight; prefill unpacks a KC x 16 panel to fp32 once per MC-row block and runs
 * tt_linear's micro-kernel on it. A row's bits therefore do not depend on the other rows, and
 * equal the fp32 kernel's on formats.round_to's values (tests/model/test_blockfloat.py).
 * Blocks with 0 < e < bits, whose values the card's packer wraps, are refused by the packer.
 * out % 16 == 0; returns 1 (writing nothing) otherwise. */
#if defined(__AVX2__) && defined(__FMA__)
/* Up to this many rows decode the codes in registers for every six rows (the panel's codes
 * stay in cache between the groups); more unpack each panel's k-block to fp32 once per MC rows
 * and run tt_linear's micro-kernel (the same products, the same order: the same bits). */
#define TT_BFP_DIRECT_ROWS 24

/* The 16 codes of one (panel, k) as signed integer-valued floats, outputs 0-7 and 8-15. */
static inline __attribute__((always_inline)) void tt_bfp_ints(const uint8_t *p, const int bits,
                                                               __m256 *lo, __m256 *hi) {
    __m128i s;
    if (bits == 7) {
        const __m128i b = _mm_loadu_si128((const __m128i *)p);
        const __m128i mag = _mm_and_si128(b, _mm_set1_epi8(0x7f));
        /* blendv picks by each byte's top bit: the sign */
        s = _mm_blendv_epi8(mag, _mm_sub_epi8(_mm_setzero_si128(), mag), b);
    } else {
        const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 0, -1, -2, -3, -4, -5, -6, -7);
        const __m128i b = _mm_loadl_epi64((const __m128i *)p);
        const __m128i m = _mm_set1_epi8(0x0f);
        const __m128i nib =
            _mm_unpacklo_epi64(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
        s = _mm_shuffle_epi8(lut, nib);
    }
    *lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s));
    *hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s, 8)));
}

/* The units of the blocks of m (<= 8) consecutive k's (m exponent bytes at e), as floats:
 * a block's magnitudes read back in its unit 2^(e - 127 - (bits - 1)); 0 for a zero block
 * (e == 0, or e < bits, which the packer refuses) and for the lanes past m. */
static inline __m256 tt_bfp_units8(const uint8_t *e, const int64_t m, const int bits) {
    uint8_t pad[8] = {0};
    if (m < 8) memcpy(pad, e, (size_t)m);
    const __m128i b = _mm_loadl_epi64((const __m128i *)(m < 8 ? pad : e));
    const __m256i biased = _mm256_sub_epi32(_mm256_cvtepu8_epi32(b), _mm256_set1_epi32(bits - 1));
    const __m256i kept = _mm256_max_epi32(biased, _mm256_setzero_si256());
    return _mm256_castsi256_ps(_mm256_slli_epi32(kept, 23));
}

/* The first m (<= 8) lanes set: maskload's mask for a k block of m. */
static inline __m256i tt_first_lanes(const int64_t m) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

#define TT_BFP_FMA(i) TT_FMA(i, xs + i * 8 + j)
/* n (<= 6) rows x one panel's 16 outputs over all of k, decoding the codes in registers: per 8
 * k (the last block may be shorter) the rows' x_k times their blocks' units (exact) go to a
 * small buffer, from which each k's value is broadcast into the FMAs. */
static inline __attribute__((always_inline)) void
tt_bfp_micro(const uint8_t *restrict codes, const uint8_t *restrict exps, const int bits,
             const float *restrict x, int64_t ldx, int64_t in, float *restrict y, int64_t ldy,
             const int n) {
    const int first = 1; /* tt_linear's chains start from +0 */
    TT_LIN_ACC(0) TT_LIN_ACC(1) TT_LIN_ACC(2) TT_LIN_ACC(3) TT_LIN_ACC(4) TT_LIN_ACC(5)
    const int64_t stride = bits == 7 ? 16 : 8;
    float xs[6 * 8] __attribute__((aligned(32)));
    for (int64_t k0 = 0; k0 < in; k0 += 8) {
        const int64_t m = in - k0 < 8 ? in - k0 : 8;
        const __m256 units = tt_bfp_units8(exps + k0, m, bits);
        for (int i = 0; i < n; i++) {
            const float *xi = x + i * ldx + k0;
            const __m256 xv = m == 8 ? _mm256_loadu_ps(xi) : _mm256_maskload_ps(xi, tt_first_lanes(m));
            _mm256_store_ps(xs + i * 8, _mm256_mul_ps(xv, units));
        }
        for (int j = 0; j < m; j++) {
            __m256 u, v;
            tt_bfp_ints(codes + (k0 + j) * stride, bits, &u, &v);
            TT_BFP_FMA(0) TT_BFP_FMA(1) TT_BFP_FMA(2) TT_BFP_FMA(3) TT_BFP_FMA(4) TT_BFP_FMA(5)
        }
    }
    TT_LIN_OUT(0) TT_LIN_OUT(1) TT_LIN_OUT(2) TT_LIN_OUT(3) TT_LIN_OUT(4) TT_LIN_OUT(5)
}

static void tt_bfp_rows(const uint8_t *codes, const uint8_t *exps, int bits, const float *x,
                        int64_t ldx, int64_t in, float *y, int64_t ldy, int64_t n) {
#define TT_BFP_CASE(b, r)                                                                         \
    if (bits == b && n == r) {                                                                \
        tt_bfp_micro(codes, exps, b, x, ldx, in, y, ldy, r);                                           \
        return;                                                                                   \
    }
    TT_BFP_CASE(7, 1) TT_BFP_CASE(7, 2) TT_BFP_CASE(7, 3) TT_BFP_CASE(7, 4) TT_BFP_CASE(7, 5)
    TT_BFP_CASE(7, 6) TT_BFP_CASE(3, 1) TT_BFP_CASE(3, 2) TT_BFP_CASE(3, 3) TT_BFP_CASE(3, 4)
    TT_BFP_CASE(3, 5) TT_BFP_CASE(3, 6)
#undef TT_BFP_CASE
}

/* One panel's k-block [k0, k0 + kn) unpacked to fp32 in tt_linear's layout: w0 [kn][8] for
 * outputs 0-7, w1 [kn][8] for 8-15. */
static void tt_bfp_unpack(const uint8_t *codes, const uint8_t *exps, int bits, int64_t kn,
                          float *w0, float *w1) {
    const int64_t stride = bits == 7 ? 16 : 8;
    float units[8] __attribute__((aligned(32)));
    for (int64_t k = 0; k < kn; k++) {
        if (k % 8 == 0) _mm256_store_ps(units, tt_bfp_units8(exps + k, kn - k < 8 ? kn - k : 8, bits));
        __m256 u, v;
        tt_bfp_ints(codes + k * stride, bits, &u, &v);
        const __m256 unit = _mm256_broadcast_ss(units + k % 8);
        _mm256_storeu_ps(w0 + k * 8, _mm256_mul_ps(u, unit));
        _mm256_storeu_ps(w1 + k * 8, _mm256_mul_ps(v, unit));
    }
}
#endif

int tt_bfp_linear(const uint8_t *codes, const uint8_t *exps, int32_t bits, const float *x,
                  int64_t rows, int64_t out, int64_t in, float *y) {
#if defined(__AVX2__) && defined(__FMA__)
    if (out % 16 != 0 || rows < 0 || in < 1 || (bits != 7 && bits != 3)) return 1;
    if (rows == 0) return 0;
    const int64_t panels = out / 16, stride = bits == 7 ? 16 : 8;
    if (rows <= TT_BFP_DIRECT_ROWS) { /* decode in registers, six rows at a time per panel */
#pragma omp parallel for schedule(static)
        for (int64_t p = 0; p < panels; p++)
            for (int64_t r0 = 0; r0 < rows; r0 += TT_MR)
                tt_bfp_rows(codes + p * in * stride, exps + p * in, bits, x + r0 * in, in, in,
                            y + r0 * out + p * 16, out, rows - r0 < TT_MR ? rows - r0 : TT_MR);
        return 0;
    }
    float *xp = malloc(sizeof(float) * TT_MC * TT_KC);
    if (xp == NULL) return 1;
    int failed = 0;
#pragma omp parallel
    {
        float *wp = malloc(sizeof(float) * 2 * TT_KC * 8);
        if (wp == NULL) {
#pragma omp atomic write
            failed = 1;
        }
        for (int64_t k0 = 0; k0 < in; k0 += TT_KC) {
            const int64_t kn = in - k0 < TT_KC ? in - k0 : TT_KC;
            for (int64_t m0 = 0; m0 < rows; m0 += TT_MC) {
                const int64_t mn = rows - m0 < TT_MC ? rows - m0 : TT_MC;
#pragma omp for schedule(static)
                for (int64_t g = 0; g < mn; g += TT_MR)
                    for (int64_t k = 0; k < kn; k++)
                        for (int64_t i = 0; i < TT_MR; i++)
                            xp[g * kn + k * TT_MR + i] =
                                g + i < mn ? x[(m0 + g + i) * in + k0 + k] : 0.0f;
#pragma omp for schedule(static)
                for (int64_t p = 0; p < panels; p++) {
                    if (wp == NULL) continue;
                    tt_bfp_unpack(codes + (p * in + k0) * stride, exps + p * in + k0, bits, kn,
                                  wp, wp + TT_KC * 8);
                    for (int64_t g = 0; g < mn; g += TT_MR)
                        tt_lin_rows(wp, wp + TT_KC * 8, xp + g * kn, TT_MR, 1,
                                    y + (m0 + g) * out + p * 16, out, kn, k0 == 0,
                                    mn - g < TT_MR ? mn - g : TT_MR);
                }
            }
        }
        free(wp);
    }
    free(xp);
    return failed;
#else
    (void)codes, (void)exps, (void)bits, (void)x, (void)rows, (void)out, (void)in, (void)y;
    return 1;
#endif
}
