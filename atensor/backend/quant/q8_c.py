"""The C of the optional Q8-activation matmul (backend/quant/source.py's SOURCE holds it): llama.cpp's numerics,
where the activations are quantized too and each block's dot product is in integers.

Why a second numerics at all: the default kernels (backend/quant/source.py) decode each weight to float32 and
multiply it by the float32 activation, so a packed model computes with exactly its float32 model's
weights (greedy ids equal transformers'); the decode is most of their time. llama.cpp instead
quantizes each row of x to Q8_0 per 32 values (d = max|x| / 127, q = round(x / d)) and multiplies
int4/int8 by int8 with one instruction per 32 pairs (AVX2 `maddubs`), then scales each block's integer
sum once. That is faster and changes the results by the activations' rounding (a relative error of
up to 1/254 per value): it is selectable (`PackedWeight(..., activations="q8_0")`,
`Llama(weights="q8act")`), never the default.

Per block b of a weight row and of a row of x:
    Q4_0  d_w * d_x * sum((q_w - 8) * q_x)           (q_w - 8: a signed int8, as llama.cpp does)
    Q4_1  d_w * d_x * sum(q_w * q_x) + m_w * d_x * s_x   (s_x = sum(q_x), kept with the x block)
    Q8_0  d_w * d_x * sum(q_w * q_x)
F16 and BF16 weights keep float32 activations (backend/quant/pool_c.py falls back to the default kernel).
Unlike llama.cpp, d_x stays float32 (llama.cpp rounds it to fp16: a relative change under 2^-11 of
the block's scale). The integer sums are exact in every path; the paths differ only in the order of
the float sums over blocks. The AVX-512 path runs the AVX2 code (256-bit `maddubs`): no VNNI version
is written, since no CPU here has it to test it on.
"""
from __future__ import annotations

Q8_SOURCE = r"""
#define ATQ_Q8ACT 16  /* fmt | ATQ_Q8ACT: x quantized to Q8_0 per 32, integer block dot products */
typedef struct { float d; int32_t s; int8_t q[32]; } atq_xblock;  /* one block of a quantized row of x */

/* x (m, cols) -> m * cols/32 blocks: d = max|x| / 127, q = round(x / d) (half away from zero: roundf) */
static void atq_quantize_x(const float *x, atq_xblock *out, int64_t m, int64_t cols) {
  int64_t nb = cols / 32;
  for (int64_t i = 0; i < m * nb; i++) {
    const float *v = x + i * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fabsf(v[j]) > amax ? fabsf(v[j]) : amax;
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t s = 0;
    for (int j = 0; j < 32; j++) { out[i].q[j] = (int8_t)roundf(v[j] * id); s += out[i].q[j]; }
    out[i].d = d;
    out[i].s = s;
  }
}
void atq_quantize_x_export(const float *x, void *out, int64_t m, int64_t cols) {  /* for the tests */
  atq_quantize_x(x, (atq_xblock *)out, m, cols);
}

static float atq_q8dot_portable(int fmt, const uint8_t *w, const atq_xblock *xb, int64_t nb) {
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; b++) {
    const int8_t *q = xb[b].q;
    int32_t acc = 0;
    if (fmt == ATQ_Q8_0) {
      const atq_block_q8_0 *blk = (const atq_block_q8_0 *)(w + b * 34);
      for (int j = 0; j < 32; j++) acc += blk->qs[j] * q[j];
      sum += atq_half(blk->d) * xb[b].d * (float)acc;
    } else {
      const uint8_t *qs = w + b * atq_row_bytes(fmt, 32) + (fmt == ATQ_Q4_1 ? 4 : 2);
      int off = fmt == ATQ_Q4_0 ? 8 : 0;
      for (int j = 0; j < 16; j++) acc += ((qs[j] & 0x0F) - off) * q[j] + ((qs[j] >> 4) - off) * q[j + 16];
      float d = atq_half(atq_u16(w + b * atq_row_bytes(fmt, 32)));
      sum += d * xb[b].d * (float)acc;
      if (fmt == ATQ_Q4_1) sum += atq_half(atq_u16(w + b * 20 + 2)) * xb[b].d * (float)xb[b].s;
    }
  }
  return sum;
}

#ifdef ATQ_X86
/* 32 signed weights of a block as int8 (Q4 nibbles minus 8, or Q8_0's own), or Q4_1's unsigned nibbles */
static inline ATQ_AVX2 __m256i atq_q8_weights_avx2(int fmt, const uint8_t *p) {
  if (fmt == ATQ_Q8_0) return _mm256_loadu_si256((const __m256i *)(p + 2));
  __m128i bytes = _mm_loadu_si128((const __m128i *)(p + (fmt == ATQ_Q4_1 ? 4 : 2)));
  __m128i mask = _mm_set1_epi8(0x0F);
  __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask), _mm_and_si128(bytes, mask));
  return fmt == ATQ_Q4_0 ? _mm256_sub_epi8(q, _mm256_set1_epi8(8)) : q;
}
static ATQ_AVX2 float atq_q8dot_avx2(int fmt, const uint8_t *w, const atq_xblock *xb, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  __m256i ones = _mm256_set1_epi16(1);
  float extra = 0.0f;  /* Q4_1: the m_w * d_x * s_x terms */
  int64_t bytes = atq_row_bytes(fmt, 32);
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t *p = w + b * bytes;
    __m256i wq = atq_q8_weights_avx2(fmt, p), xq = _mm256_loadu_si256((const __m256i *)xb[b].q);
    __m256i u = wq, s = xq;  /* maddubs multiplies unsigned by signed: |w| and x with w's sign */
    if (fmt != ATQ_Q4_1) { u = _mm256_sign_epi8(wq, wq); s = _mm256_sign_epi8(xq, wq); }
    __m256i sums = _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones);  /* 8 int32, exact */
    float scale = _cvtsh_ss(atq_u16(p)) * xb[b].d;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(scale), _mm256_cvtepi32_ps(sums), acc);
    if (fmt == ATQ_Q4_1) extra += _cvtsh_ss(atq_u16(p + 2)) * xb[b].d * (float)xb[b].s;
  }
  return atq_hsum256(acc) + extra;
}

/* one weight row against four rows of quantized x (ld blocks apart): each block unpacked once for the
   four; the same per-block products and sums as atq_q8dot_avx2 gives each row alone */
static ATQ_AVX2 void atq_q8dot4_avx2(int fmt, const uint8_t *w, const atq_xblock *xb, int64_t ld, int64_t nb,
                                     float *out, int64_t ldo) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  __m256i ones = _mm256_set1_epi16(1);
  float extra[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int64_t bytes = atq_row_bytes(fmt, 32);
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t *p = w + b * bytes;
    __m256i wq = atq_q8_weights_avx2(fmt, p);
    __m256i u = fmt != ATQ_Q4_1 ? _mm256_sign_epi8(wq, wq) : wq;
    float d = _cvtsh_ss(atq_u16(p)), m = fmt == ATQ_Q4_1 ? _cvtsh_ss(atq_u16(p + 2)) : 0.0f;
    for (int r = 0; r < 4; r++) {
      const atq_xblock *x = xb + r * ld + b;
      __m256i xq = _mm256_loadu_si256((const __m256i *)x->q);
      __m256i s = fmt != ATQ_Q4_1 ? _mm256_sign_epi8(xq, wq) : xq;
      __m256i sums = _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones);
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * x->d), _mm256_cvtepi32_ps(sums), acc[r]);
      if (fmt == ATQ_Q4_1) extra[r] += m * x->d * (float)x->s;
    }
  }
  for (int r = 0; r < 4; r++) out[r * ldo] = atq_hsum256(acc[r]) + extra[r];
}
#endif

/* rows [r0, r1) of y = x . W^T with x already quantized (`x` points to m * cols/32 atq_xblocks): each
   weight row is read once, from memory, for all rows of x, and each of its blocks unpacked once for
   four rows of x at a time */
static void atq_q8dot4_portable(int fmt, const uint8_t *w, const atq_xblock *xb, int64_t ld, int64_t nb,
                                float *out, int64_t ldo) {
  for (int r = 0; r < 4; r++) out[r * ldo] = atq_q8dot_portable(fmt, w, xb + r * ld, nb);
}
#define ATQ_Q8_ROWS(PATH, ATTR)                                                                           \
  static ATTR void atq_q8_rows_##PATH(int fmt, const float *x, const uint8_t *w, float *y, int64_t m,      \
                                      int64_t cols, int64_t rows, int64_t r0, int64_t r1) {               \
    const atq_xblock *xq = (const atq_xblock *)(const void *)x;                                           \
    int64_t nb = cols / 32, rb = atq_row_bytes(fmt, cols);                                                \
    if (m == 1 && atq_q8_gemv_##PATH(fmt, w, xq, y, cols, r0, r1)) return;                                \
    for (int64_t r = r0; r < r1; r++) {                                                                   \
      int64_t i = 0;                                                                                      \
      for (; i + 4 <= m; i += 4) atq_q8dot4_##PATH(fmt, w + r * rb, xq + i * nb, nb, nb, y + i * rows + r, rows); \
      for (; i < m; i++) y[i * rows + r] = atq_q8dot_##PATH(fmt, w + r * rb, xq + i * nb, nb);            \
    }                                                                                                     \
  }
/* one row of x: AVX2 takes four weight rows per pass (backend/quant/gemv_c.py); 0 = not taken here */
static inline int atq_q8_gemv_portable(int fmt, const uint8_t *w, const atq_xblock *x, float *y, int64_t cols,
                                       int64_t r0, int64_t r1) {
  (void)fmt; (void)w; (void)x; (void)y; (void)cols; (void)r0; (void)r1;
  return 0;
}
ATQ_Q8_ROWS(portable, )
#ifdef ATQ_X86
static ATQ_AVX2 void atq_gemv_avx2(int fmt, int q8, const uint8_t *w, const void *x, float *y, int64_t cols,
                                   int64_t r0, int64_t r1);
static inline ATQ_AVX2 int atq_q8_gemv_avx2(int fmt, const uint8_t *w, const atq_xblock *x, float *y, int64_t cols,
                                            int64_t r0, int64_t r1) {
  atq_gemv_avx2(fmt, 1, w, x, y, cols, r0, r1);
  return 1;
}
ATQ_Q8_ROWS(avx2, ATQ_AVX2)
#endif
"""
