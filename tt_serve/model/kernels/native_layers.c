/* CPU kernels of tt-serve's torch backend, the layers' side (native.c has the matrix products
 * and says how the library is built and called): Qwen3.5's RMSNorm with its residual add, decode
 * attention over the paged KV, and one Gated DeltaNet layer between its projections (the conv,
 * the norms, the gates, the delta rule and the gated norm). fp32 or bf16 values, each rounded
 * where the torch path rounds it; every row's bits its own. */
#include "native.h"

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
