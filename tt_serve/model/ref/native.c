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
 * NATIVE_ROWS). It needs AVX512-VNNI (vpdpbusd: four u8 x s8 products summed into int32 lanes,
 * no saturation); compiled without it, tt_screen_fast() is 0 and nothing here is used. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define TT_SCREEN_FAST 1
#else
#define TT_SCREEN_FAST 0
#endif

/* The interface version native.py expects (bump it with any signature change). */
int tt_native_abi(void) { return 2; }

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

static inline float tt_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return x; /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
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
