/* Fused CPU kernel of the chain verification rules of specverify.core.rules, and the native tree
 * walk of specverify.core.tree_rules (its own section at the end of the file).
 *
 * One call per rule invocation does, for every batch row: the validity screen of every input row in
 * use (one pass: no entry with its sign bit set, row sum within tolerance of 1), the accept tests on
 * the gathered scalars, and the one final distribution of the row with its float64 inverse CDF.
 *
 * The math (the reference is the readable torch code in rules.py; tests/core/test_rules_identity.py
 * and tests/core/test_native_rules.py prove the outputs bit-identical to it under the same uniforms):
 * - rejection_sample, modified rejection sampling (Leviathan et al. 2023, Algorithm 1; Chen et al.
 *   2023, Algorithm 2): accept draft x_i iff u_i * q_i(x_i) < p_i(x_i) in float64, stop at the
 *   first rejection n; then draw from the residual r = max(0, p_n - q_n) (float64, p - q rounded
 *   once), or from p_n when every draft was accepted (the bonus, n = n_b); a rejected row whose
 *   float64 residual has no mass draws from p_n (the rounding fallback).
 * - point_mass_verify: q_i = onehot(x_i): accept iff u_i < p_i(x_i); residual = p_n with x_n zeroed.
 * - greedy_verify: accept while x_i == argmax p_i (first maximal index), emit argmax p_n.
 * - inverse CDF (specverify.core.sampling.search_cdf): with c_t the float64 cumulative sums of r
 *   summed left to right (as torch.cumsum) and T = c_{V-1}, the token is the first t with
 *   c_t > min(u_K * T, nextafter(T, 0)).
 *
 * The left-to-right float64 sum is a chain of V dependent additions (~4 cycles each); the kernel
 * avoids it with a certified shortcut.  Block sums (any order) give estimates S~ of the exact prefix
 * sums; the sequential c_t and the estimates both lie within delta of the exact prefix sums (the
 * recursive-summation bound |c_t - S_t| <= gamma_n * S_n, gamma_n = n u / (1 - n u), u = 2^-53,
 * non-negative terms; addition with gradual underflow is exact in the subnormal range), so the
 * threshold lies in [th(T - delta), th(T + delta)] (th is monotone in T).  The candidate t0 is
 * returned only when S~_{t0-1} + delta <= th_lo and S~_{t0} - delta > th_hi, which proves
 * c_{t0-1} <= th < c_{t0}, i.e. t0 is the first crossing (c is non-decreasing).  Otherwise
 * (probability ~ V * 2^-50 per row) the row takes the exact sequential cumulative sum.
 *
 * The screen decides "certainly valid" on a float64 sum (error ~V * 2^-53): |S - 1| <= limit where
 * the caller passes limit = tolerance - margin, with margin larger than the rounding of the torch
 * sum the detailed check uses; anything else is reported as flagged and the caller reruns the torch
 * rule, which words the error (or accepts the input).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SV_OK 0
#define SV_FLAGGED 1
#define SV_NO_MEMORY 2

#define BLOCK 128

static inline float bf16_value(uint16_t bits) {
    uint32_t wide = (uint32_t)bits << 16;
    float value;
    memcpy(&value, &wide, sizeof value);
    return value;
}

/* A float16 value, exactly (every float16 is a float32): the F16C instruction where the compiler
 * targets it, else from the bits (a subnormal is its 10-bit mantissa times 2^-24). */
#if defined(__F16C__)
#include <immintrin.h>
static inline float f16_value(uint16_t bits) { return _cvtsh_ss(bits); }
#else
static inline float f16_value(uint16_t bits) {
    uint32_t exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu;
    float magnitude = (float)mantissa * 0x1p-24f;
    if (exponent != 0) {
        uint32_t wide = (exponent == 31 ? 0x7f800000u : (exponent + 112u) << 23) | (mantissa << 13);
        memcpy(&magnitude, &wide, sizeof magnitude);
    }
    return (bits & 0x8000u) ? -magnitude : magnitude; /* negation flips the sign bit alone */
}
#endif

static inline float f32_value(uint32_t bits) {
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* Scratch buffers kept per thread between calls (fresh large buffers would be faulted in anew). */
static __thread double *scratch_blocks, *scratch_cumulative;
static __thread size_t blocks_capacity, cumulative_capacity;

static double *grown(double **buffer, size_t *capacity, size_t needed) {
    if (needed > *capacity) {
        double *fresh = realloc(*buffer, needed * sizeof(double));
        if (!fresh) return NULL;
        *buffer = fresh;
        *capacity = needed;
    }
    return *buffer;
}

static inline double threshold_of(double u, double total) {
    double scaled = u * total, capped = nextafter(total, 0.0);
    return capped < scaled ? capped : scaled;
}

/* First index with cumulative[i] > threshold (torch.searchsorted(..., right=True)). */
static int64_t upper_bound(const double *cumulative, int64_t n, double threshold) {
    int64_t low = 0, high = n;
    while (low < high) {
        int64_t mid = low + (high - low) / 2;
        if (cumulative[mid] > threshold) high = mid; else low = mid + 1;
    }
    return low;
}


/* The hot loops: the sum (in float64) and the OR of the bit patterns of a row, and the float64 sum
 * of a block of final-distribution terms, with AVX-512 where the compiler targets it (any
 * summation order: the callers only rely on error bounds of a few hundred float64 ulps). */
#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define SV_VECTOR 1

static inline __m512d low_half_pd(__m512 x) { return _mm512_cvtps_pd(_mm512_castps512_ps256(x)); }
static inline __m512d high_half_pd(__m512 x) {
    return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
}
/* 32 bfloat16 values as two vectors of 16 floats (a 16-bit shift each). */
static inline void bf16_to_ps(__m512i x, __m512 *low, __m512 *high) {
    *low = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(x)), 16));
    *high = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(x, 1)), 16));
}

/* 32 float16 values as two vectors of 16 floats (exact conversions). */
static inline void f16_to_ps(__m512i x, __m512 *low, __m512 *high) {
    *low = _mm512_cvtph_ps(_mm512_castsi512_si256(x));
    *high = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(x, 1));
}

static int64_t f32_vector_row(const uint32_t *row, int64_t vocab, double *sum, uint32_t *bits) {
    __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    __m512i any = _mm512_setzero_si512();
    int64_t t = 0;
    for (; t + 32 <= vocab; t += 32) {
        __m512 x0 = _mm512_loadu_ps(row + t), x1 = _mm512_loadu_ps(row + t + 16);
        any = _mm512_or_si512(any, _mm512_or_si512(_mm512_castps_si512(x0), _mm512_castps_si512(x1)));
        a0 = _mm512_add_pd(a0, low_half_pd(x0));
        a1 = _mm512_add_pd(a1, high_half_pd(x0));
        a2 = _mm512_add_pd(a2, low_half_pd(x1));
        a3 = _mm512_add_pd(a3, high_half_pd(x1));
    }
    *sum = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3)));
    *bits = (uint32_t)_mm512_reduce_or_epi32(any);
    return t;
}

/* Sum of max(0, p - q) (q given) or of p over [start, start + 32 * n), from float vectors. */
static inline __m512d residual_pd(__m512d p, __m512d q) { return _mm512_max_pd(_mm512_sub_pd(p, q), _mm512_setzero_pd()); }

static int64_t f32_vector_block(const uint32_t *p, const uint32_t *q, int64_t start, int64_t end, double *sum) {
    __m512d a0 = _mm512_setzero_pd(), a1 = a0;
    int64_t t = start;
    if (q) {
        for (; t + 16 <= end; t += 16) {
            __m512 x = _mm512_loadu_ps(p + t), y = _mm512_loadu_ps(q + t);
            a0 = _mm512_add_pd(a0, residual_pd(low_half_pd(x), low_half_pd(y)));
            a1 = _mm512_add_pd(a1, residual_pd(high_half_pd(x), high_half_pd(y)));
        }
    } else {
        for (; t + 16 <= end; t += 16) {
            __m512 x = _mm512_loadu_ps(p + t);
            a0 = _mm512_add_pd(a0, low_half_pd(x));
            a1 = _mm512_add_pd(a1, high_half_pd(x));
        }
    }
    *sum = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
    return t;
}

/* Half-precision rows (bfloat16, float16) are summed in float32 lanes (each value is exact in
 * float32), flushed to float64 every 2048 values: relative error <= 64 * 2^-24 + V * 2^-53, far
 * inside the half-precision margins (7.8e-3 for bfloat16, 9.8e-4 for float16), and half the
 * conversions of a float64 sum. */
#define DEFINE_HALF_VECTOR(NAME, TO_PS)                                                               \
static int64_t NAME##_vector_row(const uint16_t *row, int64_t vocab, double *sum, uint16_t *bits) {  \
    __m512d total = _mm512_setzero_pd();                                                              \
    __m512i any = _mm512_setzero_si512();                                                             \
    int64_t t = 0;                                                                                    \
    while (t + 32 <= vocab) {                                                                         \
        __m512 f0 = _mm512_setzero_ps(), f1 = f0;                                                     \
        int64_t stop = t + 2048 < vocab ? t + 2048 : vocab;                                           \
        for (; t + 32 <= stop; t += 32) {                                                             \
            __m512i x = _mm512_loadu_si512(row + t);                                                  \
            __m512 low, high;                                                                         \
            any = _mm512_or_si512(any, x);                                                            \
            TO_PS(x, &low, &high);                                                                    \
            f0 = _mm512_add_ps(f0, low);                                                              \
            f1 = _mm512_add_ps(f1, high);                                                             \
        }                                                                                             \
        total = _mm512_add_pd(total, _mm512_add_pd(_mm512_add_pd(low_half_pd(f0), high_half_pd(f0)),   \
                                                   _mm512_add_pd(low_half_pd(f1), high_half_pd(f1)))); \
    }                                                                                                 \
    *sum = _mm512_reduce_add_pd(total);                                                               \
    uint32_t wide = (uint32_t)_mm512_reduce_or_epi32(any);                                            \
    *bits = (uint16_t)(wide | (wide >> 16));                                                          \
    return t;                                                                                         \
}                                                                                                     \
                                                                                                      \
static int64_t NAME##_vector_block(const uint16_t *p, const uint16_t *q, int64_t start, int64_t end,  \
                                   double *sum) {                                                     \
    __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;                                      \
    int64_t t = start;                                                                                \
    for (; t + 32 <= end; t += 32) {                                                                  \
        __m512 pl, ph;                                                                                \
        TO_PS(_mm512_loadu_si512(p + t), &pl, &ph);                                                   \
        if (q) {                                                                                      \
            __m512 ql, qh;                                                                            \
            TO_PS(_mm512_loadu_si512(q + t), &ql, &qh);                                               \
            a0 = _mm512_add_pd(a0, residual_pd(low_half_pd(pl), low_half_pd(ql)));                    \
            a1 = _mm512_add_pd(a1, residual_pd(high_half_pd(pl), high_half_pd(ql)));                  \
            a2 = _mm512_add_pd(a2, residual_pd(low_half_pd(ph), low_half_pd(qh)));                    \
            a3 = _mm512_add_pd(a3, residual_pd(high_half_pd(ph), high_half_pd(qh)));                  \
        } else {                                                                                      \
            a0 = _mm512_add_pd(a0, low_half_pd(pl));                                                  \
            a1 = _mm512_add_pd(a1, high_half_pd(pl));                                                 \
            a2 = _mm512_add_pd(a2, low_half_pd(ph));                                                  \
            a3 = _mm512_add_pd(a3, high_half_pd(ph));                                                 \
        }                                                                                             \
    }                                                                                                 \
    *sum = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3)));         \
    return t;                                                                                         \
}
DEFINE_HALF_VECTOR(bf16, bf16_to_ps)
DEFINE_HALF_VECTOR(f16, f16_to_ps)
#else
#define SV_VECTOR 0
#define NO_VECTOR_ROW(NAME, BITS) \
    static int64_t NAME##_vector_row(const BITS *row, int64_t vocab, double *sum, BITS *bits) { \
        (void)row; (void)vocab; *sum = 0; *bits = 0; return 0; } \
    static int64_t NAME##_vector_block(const BITS *p, const BITS *q, int64_t start, int64_t end, double *sum) { \
        (void)p; (void)q; (void)end; *sum = 0; return start; }
NO_VECTOR_ROW(f32, uint32_t)
NO_VECTOR_ROW(bf16, uint16_t)
NO_VECTOR_ROW(f16, uint16_t)
#endif

/* Everything element-type specific, instantiated for float32 (uint32_t bits), bfloat16 and float16
 * (uint16_t). */
#define DEFINE_KERNELS(NAME, BITS, VALUE, SIGN)                                                        \
                                                                                                      \
/* 1 when the row certainly passes the screen: no sign bit set, |float64 sum - 1| <= limit. */        \
static int NAME##_row_ok(const BITS *row, int64_t vocab, double limit) {                              \
    double sum; BITS sign;                                                                            \
    int64_t t = NAME##_vector_row(row, vocab, &sum, &sign);                                           \
    for (; t < vocab; t++) { sum += (double)VALUE(row[t]); sign |= row[t]; }                          \
    return !(sign & SIGN) && fabs(sum - 1.0) <= limit;                                                \
}                                                                                                     \
                                                                                                      \
/* Term t of the final distribution: p, max(0, p - q) when q is given, 0 at zero_at. */               \
static inline double NAME##_term(const BITS *p, const BITS *q, int64_t zero_at, int64_t t) {          \
    if (t == zero_at) return 0.0;                                                                     \
    double x = (double)VALUE(p[t]);                                                                   \
    if (q) { x -= (double)VALUE(q[t]); x = x > 0.0 ? x : 0.0; }                                       \
    return x;                                                                                         \
}                                                                                                     \
                                                                                                      \
static double NAME##_block_sum(const BITS *p, const BITS *q, int64_t zero_at, int64_t start,          \
                               int64_t end) {                                                         \
    int64_t t = start;                                                                                \
    if (zero_at >= start && zero_at < end) {                                                          \
        double sum = 0;                                                                               \
        for (; t < end; t++) sum += NAME##_term(p, q, zero_at, t);                                    \
        return sum;                                                                                   \
    }                                                                                                 \
    double sum;                                                                                       \
    t = NAME##_vector_block(p, q, start, end, &sum);                                                  \
    for (; t < end; t++) sum += NAME##_term(p, q, -1, t);                                             \
    return sum;                                                                                       \
}                                                                                                     \
                                                                                                      \
/* The inverse-CDF token of the final distribution (see the file comment), or -2 when the             \
 * distribution has no mass (every term 0), -3 when out of memory.  *exact_rows counts the rows       \
 * that took the sequential cumulative sum. */                                                        \
static int64_t NAME##_draw(const BITS *p, const BITS *q, int64_t zero_at, int64_t vocab, double u,   \
                           int force_exact, int64_t *exact_rows) {                                    \
    int64_t num_blocks = (vocab + BLOCK - 1) / BLOCK;                                                 \
    double *blocks = grown(&scratch_blocks, &blocks_capacity, (size_t)num_blocks);                    \
    if (!blocks) return -3;                                                                           \
    double approx_total = 0;                                                                          \
    for (int64_t b = 0; b < num_blocks; b++) {                                                        \
        int64_t end = (b + 1) * BLOCK < vocab ? (b + 1) * BLOCK : vocab;                              \
        blocks[b] = NAME##_block_sum(p, q, zero_at, b * BLOCK, end);                                  \
        approx_total += blocks[b];                                                                    \
    }                                                                                                 \
    if (!(approx_total > 0.0)) {                                                                      \
        if (approx_total == 0.0) return -2;                                                           \
        force_exact = 1; /* NaN (unvalidated input): the sequential path decides */                   \
    }                                                                                                 \
    if (!force_exact && isfinite(approx_total)) {                                                     \
        /* delta >= 2 * (bound on |c_t - S_t| + bound on |S~_t - S_t|): operations along any path:    \
         * vocab for the sequential sum, num_blocks + 3 * BLOCK for the estimates. */                 \
        double delta = 2.0 * (double)(vocab + num_blocks + 3 * BLOCK)                                 \
                       * (approx_total * 0x1p-53 * 1.01 + 0x1p-1074);                                 \
        double low_total = approx_total - delta;                                                      \
        double th = threshold_of(u, approx_total);                                                    \
        double th_low = threshold_of(u, low_total > 0.0 ? low_total : 0.0);                           \
        double th_high = threshold_of(u, approx_total + delta);                                       \
        double before = 0;                                                                            \
        int64_t b = 0;                                                                                \
        for (; b < num_blocks; b++) {                                                                 \
            double after = before + blocks[b];                                                        \
            if (after > th) break;                                                                    \
            before = after;                                                                           \
        }                                                                                             \
        if (b < num_blocks) {                                                                         \
            int64_t end = (b + 1) * BLOCK < vocab ? (b + 1) * BLOCK : vocab;                          \
            for (int64_t t = b * BLOCK; t < end; t++) {                                               \
                double estimate = before + NAME##_term(p, q, zero_at, t);                             \
                if (estimate > th) {                                                                  \
                    if ((t == 0 || before + delta <= th_low) && estimate - delta > th_high) return t; \
                    break;                                                                            \
                }                                                                                     \
                before = estimate;                                                                    \
            }                                                                                         \
        }                                                                                             \
    }                                                                                                 \
    ++*exact_rows;                                                                                    \
    double *cumulative = grown(&scratch_cumulative, &cumulative_capacity, (size_t)vocab);             \
    if (!cumulative) return -3;                                                                       \
    double running = 0;                                                                               \
    for (int64_t t = 0; t < vocab; t++) { running += NAME##_term(p, q, zero_at, t); cumulative[t] = running; } \
    if (running <= 0.0) return -2;                                                                    \
    return upper_bound(cumulative, vocab, threshold_of(u, running));                                  \
}                                                                                                     \
                                                                                                      \
/* The final token of a row: the draw of (p, q, zero_at), or of p alone when that has no mass. */    \
static int64_t NAME##_final(const BITS *p, const BITS *q, int64_t zero_at, int64_t vocab, double u,  \
                            int force_exact, int64_t *exact_rows) {                                   \
    int64_t token = NAME##_draw(p, q, zero_at, vocab, u, force_exact, exact_rows);                    \
    if (token == -2 && (q || zero_at >= 0))                                                           \
        token = NAME##_draw(p, NULL, -1, vocab, u, force_exact, exact_rows);                          \
    if (token == -2) token = vocab; /* no mass at all: searchsorted's answer (invalid input only) */  \
    return token;                                                                                     \
}                                                                                                     \
                                                                                                      \
/* Index of the first maximum of a non-negative row, from the integer order of the bit patterns,     \
 * or -1 when an entry has its sign bit set or is NaN (then torch.argmax decides). */                 \
static int64_t NAME##_argmax(const BITS *row, int64_t vocab, uint32_t infinity_bits) {                \
    BITS largest[16] = {0}, sign[16] = {0};                                                           \
    int64_t t = 0;                                                                                    \
    for (; t + 16 <= vocab; t += 16)                                                                  \
        for (int j = 0; j < 16; j++) {                                                                \
            BITS x = row[t + j];                                                                      \
            largest[j] = x > largest[j] ? x : largest[j];                                             \
            sign[j] |= x;                                                                             \
        }                                                                                             \
    BITS max = 0, signs = 0;                                                                          \
    for (int j = 0; j < 16; j++) { max = largest[j] > max ? largest[j] : max; signs |= sign[j]; }     \
    for (; t < vocab; t++) { max = row[t] > max ? row[t] : max; signs |= row[t]; }                    \
    if ((signs & SIGN) || max > infinity_bits) return -1;                                             \
    for (t = 0; t < vocab; t++) if (row[t] == max) return t;                                          \
    return -1;                                                                                        \
}                                                                                                     \
                                                                                                      \
/* One batch row of sv_verify: the accept tests, the screen of the rows in use (validate), the final  \
 * token.  p: the row's K+1 target rows, p_step elements apart; q: its K draft rows, q_step apart   \
 * (NULL for point mass and greedy); each row's vocab entries are contiguous.                        \
 * Writes *accepted and *final_token (-3: out of memory); returns SV_OK or SV_FLAGGED. */             \
static int NAME##_verify_row(int rule, const BITS *p, int64_t p_step, const BITS *q, int64_t q_step,   \
                             const int64_t *row_tokens,                                               \
                             int64_t drafts, int64_t num_drafts, int64_t vocab, const double *u,      \
                             int validate, double target_limit, double draft_limit, int force_exact,  \
                             uint32_t infinity_bits, int64_t *exact_rows, int64_t *accepted_out,      \
                             int64_t *final_out) {                                                    \
    int64_t accepted = 0, final_token = -1;                                                           \
    if (rule == 2) {                                                                                  \
        for (int64_t i = 0; i <= drafts; i++) {                                                       \
            int64_t best = (i <= accepted || validate) ? NAME##_argmax(p + i * p_step, vocab, infinity_bits) : 0;\
            if (best < 0 || (validate && !NAME##_row_ok(p + i * p_step, vocab, target_limit))) return SV_FLAGGED;\
            if (i == accepted) {                                                                      \
                if (i < drafts && row_tokens[i] == best) accepted++;                                  \
                else final_token = best;                                                              \
            }                                                                                         \
        }                                                                                             \
        *accepted_out = accepted;                                                                     \
        *final_out = final_token;                                                                     \
        return SV_OK;                                                                                 \
    }                                                                                                 \
    if (validate) {                                                                                   \
        for (int64_t i = 0; i < drafts; i++)                                                          \
            if (q && !(VALUE(q[i * q_step + row_tokens[i]]) > 0.0f)) return SV_FLAGGED;                \
    }                                                                                                 \
    for (int64_t i = 0; i < drafts; i++) {                                                            \
        double pv = (double)VALUE(p[i * p_step + row_tokens[i]]);                                      \
        int accept = q ? u[i] * (double)VALUE(q[i * q_step + row_tokens[i]]) < pv : u[i] < pv;         \
        if (!accept) break;                                                                           \
        accepted++;                                                                                   \
    }                                                                                                 \
    int rejected = accepted < drafts;                                                                 \
    if (validate) {                                                                                   \
        for (int64_t i = 0; i <= drafts; i++)                                                         \
            if (i != accepted && !NAME##_row_ok(p + i * p_step, vocab, target_limit)) return SV_FLAGGED;\
        for (int64_t i = 0; q && i < drafts; i++)                                                     \
            if (i != accepted && !NAME##_row_ok(q + i * q_step, vocab, draft_limit)) return SV_FLAGGED;\
        if (!NAME##_row_ok(p + accepted * p_step, vocab, target_limit)) return SV_FLAGGED;             \
        if (q && rejected && !NAME##_row_ok(q + accepted * q_step, vocab, draft_limit)) return SV_FLAGGED;\
    }                                                                                                 \
    *accepted_out = accepted;                                                                         \
    *final_out = NAME##_final(p + accepted * p_step, rejected && q ? q + accepted * q_step : NULL,      \
                              rejected && !q ? row_tokens[accepted] : -1, vocab, u[num_drafts],       \
                              force_exact, exact_rows);                                               \
    return SV_OK;                                                                                     \
}

#define F32_VALUE(x) f32_value(x)
#define BF16_VALUE(x) bf16_value(x)
#define F16_VALUE(x) f16_value(x)
DEFINE_KERNELS(f32, uint32_t, F32_VALUE, 0x80000000u)
DEFINE_KERNELS(bf16, uint16_t, BF16_VALUE, 0x8000u)
DEFINE_KERNELS(f16, uint16_t, F16_VALUE, 0x8000u)

/* Common argument checks: num_draft in 0..K, the draft tokens in use in [0, V), the uniforms in
 * [0, 1).  These guard every memory access, so they run with validation off too. */
static int indices_ok(int64_t batch, int64_t num_drafts, int64_t vocab, const int64_t *tokens,
                      const int64_t *num_draft, const double *uniforms, int check_uniforms) {
    for (int64_t b = 0; b < batch; b++) {
        int64_t drafts = num_draft ? num_draft[b] : num_drafts;
        if (drafts < 0 || drafts > num_drafts) return 0;
        for (int64_t i = 0; i < drafts; i++) {
            int64_t token = tokens[b * num_drafts + i];
            if (token < 0 || token >= vocab) return 0;
        }
    }
    if (check_uniforms)
        for (int64_t k = 0; k < batch * (num_drafts + 1); k++)
            if (!(uniforms[k] >= 0.0 && uniforms[k] < 1.0)) return 0;
    return 1;
}

static void emit_row(int64_t *emitted, const int64_t *tokens, int64_t num_drafts, int64_t accepted,
                     int64_t final_token) {
    for (int64_t i = 0; i <= num_drafts; i++)
        emitted[i] = i < accepted ? tokens[i] : (i == accepted ? final_token : -1);
}

/* rule: 0 = rejection_sample, 1 = point_mass_verify, 2 = greedy_verify.  dtype: 0 = float32,
 * 1 = bfloat16, 2 = float16.  target [B, K+1, V] and draft [B, K, V] are read at element strides
 * (*_batch_step, *_step, 1): any view whose last dimension is contiguous.  draft is NULL for rules
 * 1 and 2, uniforms NULL for rule 2.  validate: screen every
 * row in use (limit = tolerance - margin, one per tensor).  check_uniforms: the uniforms were
 * injected (a generator's draw is in [0, 1) by construction).  Writes emitted [B, K+1] and
 * num_accepted [B]; exact_rows[0] counts the final rows that took the sequential cumulative sum.
 * Returns SV_OK, SV_FLAGGED (some input may be invalid: nothing reliable was written) or
 * SV_NO_MEMORY. */
int sv_verify(int rule, int dtype, const void *target, const void *draft, int64_t batch,
              int64_t num_drafts, int64_t vocab, int64_t target_batch_step, int64_t target_step,
              int64_t draft_batch_step, int64_t draft_step, const int64_t *tokens, const int64_t *num_draft,
              const double *uniforms, int validate, int check_uniforms, double target_limit,
              double draft_limit, int force_exact, int64_t *emitted, int64_t *num_accepted,
              int64_t *exact_rows) {
    int64_t positions = num_drafts + 1;
    exact_rows[0] = 0;
    if (!indices_ok(batch, num_drafts, vocab, tokens, num_draft, uniforms, validate && check_uniforms))
        return SV_FLAGGED;
    for (int64_t b = 0; b < batch; b++) {
        int64_t drafts = num_draft ? num_draft[b] : num_drafts;
        const int64_t *row_tokens = tokens + b * num_drafts;
        const double *u = uniforms ? uniforms + b * positions : NULL;
        int64_t accepted = 0, final_token = -1;
        int status;
        if (dtype == 0)
            status = f32_verify_row(rule, (const uint32_t *)target + b * target_batch_step, target_step,
                                    draft ? (const uint32_t *)draft + b * draft_batch_step : NULL, draft_step,
                                    row_tokens, drafts, num_drafts, vocab, u, validate, target_limit, draft_limit,
                                    force_exact, 0x7f800000u, exact_rows, &accepted, &final_token);
        else if (dtype == 1)
            status = bf16_verify_row(rule, (const uint16_t *)target + b * target_batch_step, target_step,
                                     draft ? (const uint16_t *)draft + b * draft_batch_step : NULL, draft_step,
                                     row_tokens, drafts, num_drafts, vocab, u, validate, target_limit, draft_limit,
                                     force_exact, 0x7f80u, exact_rows, &accepted, &final_token);
        else
            status = f16_verify_row(rule, (const uint16_t *)target + b * target_batch_step, target_step,
                                    draft ? (const uint16_t *)draft + b * draft_batch_step : NULL, draft_step,
                                    row_tokens, drafts, num_drafts, vocab, u, validate, target_limit, draft_limit,
                                    force_exact, 0x7c00u, exact_rows, &accepted, &final_token);
        if (status != SV_OK) return status;
        if (final_token == -3) return SV_NO_MEMORY;
        num_accepted[b] = accepted;
        emit_row(emitted + b * positions, row_tokens, num_drafts, accepted, final_token);
    }
    return SV_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Tree rules (specverify.core.tree_rules: tree_rejection_sample, point_mass_tree_verify).
 *
 * The walk of _tree_walk, driven from Python one node index at a time.  Per row the current law r
 * (float64, total s) is either the unmodified target row at the current node (s = 1; read from the
 * input, whose float64 cast is exact: nothing is copied) or a residual held in one of two float64
 * [B, V] buffers.  sv_tree_advance runs the accept tests of the tested rows of node n on gathered
 * scalars (u_n * q_n(x_n) * s < r(x_n) in float64, left to right as the torch expression; an
 * accepting row's law becomes its node's target row) and writes each rejecting row's
 * max(0, r - (q_n * s)) (the product rounded, then the difference, then the clamp: as
 * torch.sub(r, q.mul_(s)).clamp_(min=0); built with -ffp-contract=off, so no fused multiply-add)
 * into one of the buffers, the same for every rejecting row of the node.  It then returns to the
 * caller, which takes the totals with torch.sum over that [B, V] buffer, so that the totals are
 * torch's own bits (a C sum could not reproduce torch's summation order), and calls again to commit
 * them (a row keeps its residual iff its total is > 0, the rounding fallback) and go on.  After the
 * last node it draws each row's final token from r by the certified inverse CDF (float64 terms, or
 * the input row's terms as the chain rules' bonus draw) and writes the emitted path.
 * ------------------------------------------------------------------------------------------- */

static inline double value_at(int dtype, const void *base, int64_t index) {
    return dtype == 0 ? (double)f32_value(((const uint32_t *)base)[index])
                      : (double)bf16_value(((const uint16_t *)base)[index]);
}

static int row_ok(int dtype, const void *base, int64_t offset, int64_t vocab, double limit) {
    return dtype == 0 ? f32_row_ok((const uint32_t *)base + offset, vocab, limit)
                      : bf16_row_ok((const uint16_t *)base + offset, vocab, limit);
}

#define SV_RESIDUAL_LOOP(SOURCE, SCALED)                                                             \
    for (int64_t t = 0; t < vocab; t++) {                                                             \
        double d = (SOURCE) - (SCALED);                                                               \
        out[t] = d < 0.0 ? 0.0 : d;                                                                   \
    }

/* out := max(0, r - q * s) over the row: r is `r_row` (float64) or, when NULL, the target row at
 * `p_offset` (then s = 1); q is the draft row at `q_offset`, or onehot(token) when draft is NULL. */
static void residual_row(int dtype, const double *r_row, const void *target, int64_t p_offset, const void *draft,
                         int64_t q_offset, int64_t token, double total, int64_t vocab, double *out) {
    const uint32_t *p32 = (const uint32_t *)target + p_offset, *q32 = draft ? (const uint32_t *)draft + q_offset : NULL;
    const uint16_t *p16 = (const uint16_t *)target + p_offset, *q16 = draft ? (const uint16_t *)draft + q_offset : NULL;
    double zero_scaled = 0.0 * total;
    if (!draft) {
        if (r_row) { SV_RESIDUAL_LOOP(r_row[t], zero_scaled) }
        else if (dtype == 0) { SV_RESIDUAL_LOOP((double)f32_value(p32[t]), zero_scaled) }
        else { SV_RESIDUAL_LOOP((double)bf16_value(p16[t]), zero_scaled) }
        double r_x = r_row ? r_row[token] : value_at(dtype, target, p_offset + token);
        double d = r_x - 1.0 * total;
        out[token] = d < 0.0 ? 0.0 : d;
    } else if (dtype == 0) {
        if (r_row) { SV_RESIDUAL_LOOP(r_row[t], (double)f32_value(q32[t]) * total) }
        else { SV_RESIDUAL_LOOP((double)f32_value(p32[t]), (double)f32_value(q32[t]) * total) }
    } else {
        if (r_row) { SV_RESIDUAL_LOOP(r_row[t], (double)bf16_value(q16[t]) * total) }
        else { SV_RESIDUAL_LOOP((double)bf16_value(p16[t]), (double)bf16_value(q16[t]) * total) }
    }
}

/* Sum of r[start..end) in float64 in any order (8 independent accumulators). */
static double f64_block_sum(const double *r, int64_t start, int64_t end) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t t = start;
    for (; t + 8 <= end; t += 8)
        for (int j = 0; j < 8; j++) acc[j] += r[t + j];
    double sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; t < end; t++) sum += r[t];
    return sum;
}

/* The inverse-CDF token of a float64 row r (torch: search_cdf(r.cumsum(-1), u)), with the certified
 * shortcut of NAME##_draw; -3 when out of memory. */
static int64_t f64_draw(const double *r, int64_t vocab, double u, int force_exact, int64_t *exact_rows) {
    int64_t num_blocks = (vocab + BLOCK - 1) / BLOCK;
    double *blocks = grown(&scratch_blocks, &blocks_capacity, (size_t)num_blocks);
    if (!blocks) return -3;
    double approx_total = 0;
    for (int64_t b = 0; b < num_blocks; b++) {
        int64_t end = (b + 1) * BLOCK < vocab ? (b + 1) * BLOCK : vocab;
        blocks[b] = f64_block_sum(r, b * BLOCK, end);
        approx_total += blocks[b];
    }
    if (!force_exact && approx_total > 0.0 && isfinite(approx_total)) {
        double delta = 2.0 * (double)(vocab + num_blocks + 3 * BLOCK) * (approx_total * 0x1p-53 * 1.01 + 0x1p-1074);
        double low_total = approx_total - delta;
        double th = threshold_of(u, approx_total);
        double th_low = threshold_of(u, low_total > 0.0 ? low_total : 0.0);
        double th_high = threshold_of(u, approx_total + delta);
        double before = 0;
        int64_t b = 0;
        for (; b < num_blocks; b++) {
            double after = before + blocks[b];
            if (after > th) break;
            before = after;
        }
        if (b < num_blocks) {
            int64_t end = (b + 1) * BLOCK < vocab ? (b + 1) * BLOCK : vocab;
            for (int64_t t = b * BLOCK; t < end; t++) {
                double estimate = before + r[t];
                if (estimate > th) {
                    if ((t == 0 || before + delta <= th_low) && th_high < estimate - delta) return t;
                    break;
                }
                before = estimate;
            }
        }
    }
    ++*exact_rows;
    double *cumulative = grown(&scratch_cumulative, &cumulative_capacity, (size_t)vocab);
    if (!cumulative) return -3;
    double running = 0;
    for (int64_t t = 0; t < vocab; t++) { running += r[t]; cumulative[t] = running; }
    return upper_bound(cumulative, vocab, threshold_of(u, running));
}

/* Structure (always: it guards every memory access of the walk) and, with validate, the screen of
 * every row in use: target row 0 and n+1 and draft row n of each present node, q_n(x_n) > 0, the
 * injected uniforms in [0, 1).  Structure: tokens -1 or in [0, V), absent nodes last with parent -1,
 * a present node's parent -1 or an earlier present node.  Returns SV_OK or SV_FLAGGED (the caller's
 * torch code decides). */
static int tree_structure_ok(int64_t batch, int64_t num_nodes, int64_t vocab, const int64_t *tokens,
                             const int64_t *parents) {
    for (int64_t b = 0; b < batch; b++) {
        const int64_t *row_tokens = tokens + b * num_nodes, *row_parents = parents + b * num_nodes;
        int absent_seen = 0;
        for (int64_t n = 0; n < num_nodes; n++) {
            int64_t token = row_tokens[n], parent = row_parents[n];
            if (token == -1) {
                absent_seen = 1;
                if (parent != -1) return 0;
                continue;
            }
            if (absent_seen || token < 0 || token >= vocab || parent < -1 || parent >= n) return 0;
            if (parent >= 0 && row_tokens[parent] == -1) return 0;
        }
    }
    return 1;
}

int sv_tree_check(int dtype, const void *target, const void *draft, int64_t batch, int64_t num_nodes,
                  int64_t vocab, const int64_t *tokens, const int64_t *parents, const double *uniforms,
                  int validate, double target_limit, double draft_limit) {
    int64_t positions = num_nodes + 1;
    if (!tree_structure_ok(batch, num_nodes, vocab, tokens, parents)) return SV_FLAGGED;
    if (!validate) return SV_OK;
    if (uniforms)
        for (int64_t k = 0; k < batch * positions; k++)
            if (!(uniforms[k] >= 0.0 && uniforms[k] < 1.0)) return SV_FLAGGED;
    for (int64_t b = 0; b < batch; b++) {
        const int64_t *row_tokens = tokens + b * num_nodes;
        if (!row_ok(dtype, target, b * positions * vocab, vocab, target_limit)) return SV_FLAGGED;
        for (int64_t n = 0; n < num_nodes && row_tokens[n] >= 0; n++) {
            if (!row_ok(dtype, target, (b * positions + n + 1) * vocab, vocab, target_limit)) return SV_FLAGGED;
            if (draft) {
                int64_t row = (b * num_nodes + n) * vocab;
                if (!(value_at(dtype, draft, row + row_tokens[n]) > 0.0)) return SV_FLAGGED;
                if (!row_ok(dtype, draft, row, vocab, draft_limit)) return SV_FLAGGED;
            }
        }
    }
    return SV_OK;
}

/* emitted row: the tokens root -> last, then `final`, then -1; returns the depth of `last`. */
static int64_t emit_path_row(const int64_t *tokens, const int64_t *parents, int64_t num_nodes, int64_t last,
                             int64_t final, int64_t *out) {
    int64_t length = 0;
    for (int64_t node = last; node >= 0; node = parents[node]) length++;
    int64_t i = length;
    for (int64_t node = last; node >= 0; node = parents[node]) out[--i] = tokens[node];
    out[length] = final;
    for (i = length + 1; i <= num_nodes; i++) out[i] = -1;
    return length;
}

/* The walk from node `start` (0: from the root; the caller zeroes `held`).  State per row: current
 * node, total s, held[b] = 0 (r is the target row at the current node) or 1 + the buffer holding r.
 * When start > 0 the rows flagged in `rejecting` rejected node start-1, their residuals are in
 * buffer `*buffer` and `totals` holds torch's sums over it: commit them.  Then run nodes start,
 * start+1, ... until one has a rejecting row: its residuals are written into one buffer (`*buffer`:
 * a row whose r is held there is first moved to the other one), and the next node index is
 * returned.  After the last node, draw the final tokens, write emitted [B, N+1] and depth [B], and
 * return N+1.  Returns -3 when out of memory. */
int64_t sv_tree_advance(int dtype, const void *target, const void *draft, int64_t batch, int64_t num_nodes,
                        int64_t vocab, const int64_t *tokens, const int64_t *parents, const double *uniforms,
                        int64_t start, const double *totals, double *buffer0, double *buffer1, double *s,
                        int64_t *current, int8_t *held, int8_t *rejecting, int64_t *buffer, int force_exact,
                        int64_t *emitted, int64_t *depth, int64_t *exact_rows) {
    int64_t positions = num_nodes + 1;
    double *buffers[2] = {buffer0, buffer1};
    if (start > 0) {
        for (int64_t b = 0; b < batch; b++) {
            if (!rejecting[b]) continue;
            rejecting[b] = 0;
            if (totals[b] > 0.0) {
                held[b] = (int8_t)(1 + *buffer);
                s[b] = totals[b];
            }
        }
    }
    for (int64_t n = start; n < num_nodes; n++) {
        int64_t held_in[2] = {0, 0}, count = 0;
        for (int64_t b = 0; b < batch; b++) {
            int64_t token = tokens[b * num_nodes + n];
            rejecting[b] = 0;
            if (token < 0 || parents[b * num_nodes + n] != current[b]) continue;
            double r_x = held[b] ? buffers[held[b] - 1][b * vocab + token]
                                 : value_at(dtype, target, (b * positions + current[b] + 1) * vocab + token);
            double q_x = draft ? value_at(dtype, draft, (b * num_nodes + n) * vocab + token) : 1.0;
            double scaled = uniforms[b * positions + n] * q_x;
            scaled = scaled * s[b];
            if (scaled < r_x) {
                held[b] = 0;
                s[b] = 1.0;
                current[b] = n;
            } else {
                rejecting[b] = 1;
                count++;
                if (held[b]) held_in[held[b] - 1]++;
            }
        }
        if (!count) continue;
        int64_t into = held_in[0] <= held_in[1] ? 0 : 1;  /* the buffer fewer rejecting rows' laws are in */
        double *out_buffer = buffers[into];
        for (int64_t b = 0; b < batch; b++) {
            if (!rejecting[b]) continue;
            if (held[b] == 1 + into) {  /* keep r (for the rounding fallback) in the other buffer */
                memcpy(buffers[1 - into] + b * vocab, out_buffer + b * vocab, (size_t)vocab * sizeof(double));
                held[b] = (int8_t)(2 - into);
            }
            residual_row(dtype, held[b] ? buffers[held[b] - 1] + b * vocab : NULL, target,
                         (b * positions + current[b] + 1) * vocab, draft, (b * num_nodes + n) * vocab,
                         tokens[b * num_nodes + n], s[b], vocab, out_buffer + b * vocab);
        }
        *buffer = into;
        return n + 1;
    }
    exact_rows[0] = 0;
    for (int64_t b = 0; b < batch; b++) {
        double u = uniforms[b * positions + num_nodes];
        int64_t token;
        if (held[b]) token = f64_draw(buffers[held[b] - 1] + b * vocab, vocab, u, force_exact, exact_rows);
        else if (dtype == 0)
            token = f32_final((const uint32_t *)target + (b * positions + current[b] + 1) * vocab, NULL, -1, vocab, u,
                              force_exact, exact_rows);
        else
            token = bf16_final((const uint16_t *)target + (b * positions + current[b] + 1) * vocab, NULL, -1, vocab, u,
                               force_exact, exact_rows);
        if (token == -3) return -3;
        depth[b] = emit_path_row(tokens + b * num_nodes, parents + b * num_nodes, num_nodes, current[b], token,
                                 emitted + b * positions);
    }
    return num_nodes + 1;
}

/* Greedy tree verification (greedy_tree_verify): descend into the first child whose token is the
 * argmax (first maximal index) of the target row at the current node, then emit that row's argmax.
 * Every target row in use is screened with validate; a row with a sign bit set or a NaN (argmax
 * -1) is flagged, so that torch.argmax decides.  Returns SV_OK or SV_FLAGGED. */
int sv_tree_greedy(int dtype, const void *target, int64_t batch, int64_t num_nodes, int64_t vocab,
                   const int64_t *tokens, const int64_t *parents, int validate, double target_limit,
                   int64_t *emitted, int64_t *depth, int64_t *last_node) {
    int64_t positions = num_nodes + 1;
    if (!tree_structure_ok(batch, num_nodes, vocab, tokens, parents)) return SV_FLAGGED;
    for (int64_t b = 0; b < batch; b++) {
        const int64_t *row_tokens = tokens + b * num_nodes, *row_parents = parents + b * num_nodes;
        if (validate) {
            if (!row_ok(dtype, target, b * positions * vocab, vocab, target_limit)) return SV_FLAGGED;
            for (int64_t n = 0; n < num_nodes && row_tokens[n] >= 0; n++)
                if (!row_ok(dtype, target, (b * positions + n + 1) * vocab, vocab, target_limit)) return SV_FLAGGED;
        }
        int64_t current = -1, best = -1;
        for (int64_t n = -1; n < num_nodes; n++) {
            if (n >= 0 && !(row_tokens[n] >= 0 && row_parents[n] == current && row_tokens[n] == best)) continue;
            current = n;
            int64_t offset = (b * positions + n + 1) * vocab;
            best = dtype == 0 ? f32_argmax((const uint32_t *)target + offset, vocab, 0x7f800000u)
                              : bf16_argmax((const uint16_t *)target + offset, vocab, 0x7f80u);
            if (best < 0) return SV_FLAGGED;
        }
        last_node[b] = current;
        depth[b] = emit_path_row(row_tokens, row_parents, num_nodes, current, best, emitted + b * positions);
    }
    return SV_OK;
}
