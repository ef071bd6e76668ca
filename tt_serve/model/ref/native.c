/* CPU kernels of tt-serve's torch backend, compiled at first use by native.py with the machine's
 * own C compiler (-O3 -march=native -fopenmp) and called through ctypes on torch tensors'
 * memory. OpenMP resolves to the runtime torch has already loaded (one thread pool, sized by
 * torch.set_num_threads on the calling thread).
 *
 * The int8 screen GEMV (screen.py): approximate logits a[r][j] = (sum_k (qx[r][k] - zx) w[j][k])
 * * (sx * s[j]) of u8 activations against an s8 weight. The integer sum is exact (int32), so a
 * logit carries three fp32 roundings: sx * s[j], the int32 -> fp32 conversion (exact below 2^24),
 * and the product. oneDNN's u8 x s8 GEMM computes the same, but at one row it reads the 63.5 MB
 * demo head at about 16 GB/s; this kernel streams it about twice as fast (2 cores, the GEMV
 * alone: 1.6-2.6 against 3.4-4.8 ms at 1 row, 2.8-4.4 against 4.7-6.4 ms at 8 rows; a whole
 * greedy pick 3.0 against 5.4 ms at 1 row, 5.3 against 7.1 at 8: python -m
 * bench.lm_head_layout). From about 16 rows oneDNN's blocked GEMM is faster (screen.py's
 * NATIVE_ROWS). It needs AVX512-VNNI (vpdpbusd: four u8 x s8 products summed into int32 lanes,
 * no saturation); compiled without it, tt_screen_fast() is 0 and nothing here is used. */
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define TT_SCREEN_FAST 1
#else
#define TT_SCREEN_FAST 0
#endif

/* The interface version native.py expects (bump it with any signature change). */
int tt_native_abi(void) { return 1; }

int tt_screen_fast(void) { return TT_SCREEN_FAST; }

/* w [vocab][hidden] s8 -> out [vocab / 16][hidden / 4][16][4]: for each block of 16 tokens and
 * each group of 4 hidden positions, the 4 bytes of each token, so one 64-byte load feeds one
 * vpdpbusd for 16 tokens at once (no horizontal sums). vocab % 16 == 0, hidden % 4 == 0. */
void tt_screen_pack(const int8_t *w, int64_t vocab, int64_t hidden, int8_t *out) {
    const int64_t groups = hidden / 4;
    for (int64_t b = 0; b < vocab / 16; b++)
        for (int64_t g = 0; g < groups; g++)
            for (int64_t t = 0; t < 16; t++)
                memcpy(out + ((b * groups + g) * 16 + t) * 4, w + (b * 16 + t) * hidden + g * 4, 4);
}

/* out [rows][vocab] fp32 = (qx [rows][hidden] u8 - zx) . packed weight * (sx * scales[j]);
 * wsum[j] = sum_k w[j][k] (int32) carries the zero point. Rows go four at a time through each
 * 16-token block while the block (hidden bytes x 16, 4 KB at hidden 256) sits in L1. */
void tt_screen_gemv(const uint8_t *qx, int64_t rows, const int8_t *packed, const int32_t *wsum,
                    const float *scales, int64_t vocab, int64_t hidden, int32_t zx, float sx,
                    float *out) {
#if TT_SCREEN_FAST
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
#else
    (void)qx, (void)rows, (void)packed, (void)wsum, (void)scales;
    (void)vocab, (void)hidden, (void)zx, (void)sx, (void)out;
#endif
}
