"""The C of the kernel variants' table: every packed-matmul kernel the library holds, by family, with the
CPU features each needs, checked at run time, and the selection the entry points call (backend/quant/
source.py's SOURCE holds it after the kernels, before backend/quant/pool_c.py's entry points).

Why a table at run time, not a path chosen at compile time: one compile holds every variant (each
function carries its own `target` attribute, so the portable code builds on any CPU, ARM included),
and which is fastest is a measurement, not a name: the AVX-512 gemv lost to the AVX2 one on Zen 4
before it had rows per pass. backend/quant/kernels.py reads the table, and atensor/tune/ times the
variants and calls `atq_select`.

A family is one kind of call, chosen per call by its operands (`atq_family_of`):
    gemv_f32   one row of x (batch-1 decode), float32 activations
    gemv_q8    one row of x, activations quantized to Q8_0 (backend/quant/q8_c.py)
    rows_f32   two rows of x or more (prefill, many decode streams), float32 activations
    rows_q8    two rows of x or more, Q8 activations
    dequant    a whole matrix decoded to float32
Every variant of a family computes the same values up to the order of its float sums (the invariant
of backend/quant/source.py), and takes every format (a variant specialised to some formats runs its
ISA's general kernel for the others).

Invariants: a variant whose `needs` the CPU lacks is never selected (`atq_select` refuses it) and so
never runs; the default of each family is its supported variant of highest `rank`, and a variant not
measured on any CPU has rank -1, so it is never a default by its name; the selection is one int per
family, read and written atomically, so a select while kernels run changes the next call only.
"""
from __future__ import annotations

VARIANTS_SOURCE = r"""
typedef void (*atq_rows_fn)(int, const float *, const uint8_t *, float *, int64_t, int64_t, int64_t, int64_t,
                            int64_t);
typedef void (*atq_dequant_fn)(int, const uint8_t *, float *, int64_t, int64_t);
enum { ATQ_GEMV_F32, ATQ_GEMV_Q8, ATQ_ROWS_F32, ATQ_ROWS_Q8, ATQ_DEQUANT, ATQ_FAMILIES };
static const char *const atq_family_names[ATQ_FAMILIES] = {"gemv_f32", "gemv_q8", "rows_f32", "rows_q8", "dequant"};

/* one kernel: `needs` the CPU features (space-separated names of __builtin_cpu_supports) it runs on;
   `rank` its place as a default (the highest supported is the default; -1 never); `blocked_cols` the
   longest rows its blocked kernel takes (0: none; longer rows go to sgemm's panels, which the pool
   splits in whole panels: backend/quant/pool_c.py) */
typedef struct {
  int family; const char *name, *needs; int rank; int64_t blocked_cols; atq_rows_fn rows; atq_dequant_fn dequant;
} atq_variant;

#ifdef ATQ_X86
#define ATQ_NEEDS_AVX2 "avx2 fma f16c"
#define ATQ_NEEDS_AVX512 "avx512f avx512bw avx512vl avx2 fma f16c"
#define ATQ_NEEDS_VNNI512 "avx512vnni " ATQ_NEEDS_AVX512
#define ATQ_NEEDS_VNNI256 "avxvnni " ATQ_NEEDS_AVX2
#define ATQ_NEEDS_BF16 "avx512bf16 " ATQ_NEEDS_AVX512
#endif
static const atq_variant atq_variants[] = {
  {ATQ_GEMV_F32, "portable", "", 0, 0, atq_matmul_rows_portable, NULL},
  {ATQ_GEMV_Q8, "portable", "", 0, 0, atq_q8_rows_portable, NULL},
  {ATQ_ROWS_F32, "portable", "", 0, 0, atq_matmul_rows_portable, NULL},
  {ATQ_ROWS_Q8, "portable", "", 0, 0, atq_q8_rows_portable, NULL},
  {ATQ_DEQUANT, "portable", "", 0, 0, NULL, atq_dequant_portable},
#ifdef ATQ_X86
  /* four rows a pass; rank 3: the fastest measured on Zen 3 (AVX2 only) and on Zen 4, where it beat the
     AVX-512 variants (one decode step's matmuls, thread CPU time: 16.9 ms a token against 17.3-19.6, "avx512"
     18.1; bench/quant_step.py --variants, load 8.5) */
  {ATQ_GEMV_F32, "avx2", ATQ_NEEDS_AVX2, 3, 0, atq_matmul_rows_avx2, NULL},
  {ATQ_GEMV_F32, "avx512", ATQ_NEEDS_AVX512, 2, 0, atq_matmul_rows_avx512, NULL},      /* one row a pass */
  {ATQ_GEMV_Q8, "avx2", ATQ_NEEDS_AVX2, 1, 0, atq_q8_rows_avx2, NULL},  /* Zen 4: 13.9 ms a token, VNNI's 14.8 */
  {ATQ_ROWS_F32, "avx2", ATQ_NEEDS_AVX2, 1, ATQ_GEMM_COLS, atq_matmul_rows_avx2, NULL},
  {ATQ_ROWS_F32, "avx512", ATQ_NEEDS_AVX512, 2, ATQ_GEMM_COLS, atq_matmul_rows_avx512, NULL},  /* AVX2's blocked kernel */
  {ATQ_ROWS_Q8, "avx2", ATQ_NEEDS_AVX2, 1, 0, atq_q8_rows_avx2, NULL},
  {ATQ_DEQUANT, "avx2", ATQ_NEEDS_AVX2, 1, 0, NULL, atq_dequant_avx2},
  {ATQ_DEQUANT, "avx512", ATQ_NEEDS_AVX512, 2, 0, NULL, atq_dequant_avx512},
  /* backend/quant/avx512_c.py's: rank -1, none the fastest where measured (Zen 4: bench/quant_dot.py,
     bench/quant_step.py --variants, bench/quant_batched.py); atensor/tune/ times them on each CPU */
  {ATQ_GEMV_F32, "avx512_r1", ATQ_NEEDS_AVX512, -1, 0, atq_gemv_f32_avx512_r1, NULL},
  {ATQ_GEMV_F32, "avx512_r2", ATQ_NEEDS_AVX512, -1, 0, atq_gemv_f32_avx512_r2, NULL},
  {ATQ_GEMV_F32, "avx512_r4", ATQ_NEEDS_AVX512, -1, 0, atq_gemv_f32_avx512_r4, NULL},
  {ATQ_GEMV_F32, "avx512_r8", ATQ_NEEDS_AVX512, -1, 0, atq_gemv_f32_avx512_r8, NULL},
  {ATQ_GEMV_F32, "avx512bf16", ATQ_NEEDS_BF16, -1, 0, atq_gemv_f32_avx512bf16, NULL},
  {ATQ_GEMV_F32, "avx2vl_r4", ATQ_NEEDS_AVX512, -1, 0, atq_gemv_f32_avx2vl_r4, NULL},
  {ATQ_GEMV_F32, "avx2vl_r8", ATQ_NEEDS_AVX512, -1, 0, atq_gemv_f32_avx2vl_r8, NULL},
  {ATQ_GEMV_Q8, "avx512vnni", ATQ_NEEDS_VNNI512, -1, 0, atq_q8_avx512vnni, NULL},
  {ATQ_GEMV_Q8, "avxvnni", ATQ_NEEDS_VNNI256, -1, 0, atq_q8_avxvnni, NULL},
  {ATQ_ROWS_Q8, "avx512vnni", ATQ_NEEDS_VNNI512, -1, 0, atq_q8_avx512vnni, NULL},
  {ATQ_ROWS_Q8, "avxvnni", ATQ_NEEDS_VNNI256, -1, 0, atq_q8_avxvnni, NULL},
  {ATQ_ROWS_F32, "avx512_blocked", ATQ_NEEDS_AVX512, -1, ATQ_GEMM_COLS, atq_rows_f32_avx512_blocked, NULL},
#endif
};
#define ATQ_VARIANTS ((int)(sizeof(atq_variants) / sizeof(atq_variants[0])))

/* whether this CPU (and its OS: __builtin_cpu_supports checks the saved vector state) has one feature;
   a name this table does not know is a feature it lacks */
static int atq_cpu_has(const char *name, size_t len) {
#ifdef ATQ_X86
#define ATQ_FEATURE(s) if (len == sizeof(s) - 1 && memcmp(name, s, len) == 0) return __builtin_cpu_supports(s) != 0
  ATQ_FEATURE("avx2"); ATQ_FEATURE("fma"); ATQ_FEATURE("f16c"); ATQ_FEATURE("avx512f"); ATQ_FEATURE("avx512bw");
  ATQ_FEATURE("avx512vl"); ATQ_FEATURE("avx512vnni"); ATQ_FEATURE("avx512bf16"); ATQ_FEATURE("avxvnni");
#undef ATQ_FEATURE
#else
  (void)name; (void)len;
#endif
  return 0;
}
int atq_variant_supported(int v) {
  if (v < 0 || v >= ATQ_VARIANTS) return 0;
  for (const char *p = atq_variants[v].needs; *p;) {
    while (*p == ' ') p++;
    size_t len = strcspn(p, " ");
    if (len && !atq_cpu_has(p, len)) return 0;
    p += len;
  }
  return 1;
}

int atq_variant_count(void) { return ATQ_VARIANTS; }
const char *atq_variant_family(int v) { return atq_family_names[atq_variants[v].family]; }
const char *atq_variant_name(int v) { return atq_variants[v].name; }
const char *atq_variant_needs(int v) { return atq_variants[v].needs; }
int atq_variant_rank(int v) { return atq_variants[v].rank; }

static int atq_selected[ATQ_FAMILIES] = {-1, -1, -1, -1, -1};  /* -1: not yet chosen (the default) */
static int atq_default(int family) {
  int best = -1;
  for (int v = 0; v < ATQ_VARIANTS; v++)
    if (atq_variants[v].family == family && atq_variants[v].rank >= 0 && atq_variant_supported(v) &&
        (best < 0 || atq_variants[v].rank > atq_variants[best].rank)) best = v;
  return best;  /* never -1: each family's portable variant has rank 0 */
}
/* the variant a family's calls run now (its default until a select) */
int atq_selection(int family) {
  int v = __atomic_load_n(&atq_selected[family], __ATOMIC_RELAXED);
  if (v < 0) { v = atq_default(family); __atomic_store_n(&atq_selected[family], v, __ATOMIC_RELAXED); }
  return v;
}
/* makes variant v its family's selection; 0 (nothing changed) for an index out of range or a variant
   this CPU cannot run. v = -1 - family puts that family back on its default */
int atq_select(int v) {
  if (v < 0 && -1 - v < ATQ_FAMILIES) { __atomic_store_n(&atq_selected[-1 - v], -1, __ATOMIC_RELAXED); return 1; }
  if (!atq_variant_supported(v)) return 0;
  __atomic_store_n(&atq_selected[atq_variants[v].family], v, __ATOMIC_RELAXED);
  return 1;
}
static uint64_t atq_variant_runs[ATQ_VARIANTS];  /* calls per variant (racy counts: the tests see which ran) */
uint64_t atq_variant_calls(int v) { return v >= 0 && v < ATQ_VARIANTS ? __atomic_load_n(&atq_variant_runs[v], __ATOMIC_RELAXED) : 0; }
static inline void atq_count_call(int v) { __atomic_fetch_add(&atq_variant_runs[v], 1, __ATOMIC_RELAXED); }
int atq_family_of(int q8, int64_t m) { return m == 1 ? (q8 ? ATQ_GEMV_Q8 : ATQ_GEMV_F32) : (q8 ? ATQ_ROWS_Q8 : ATQ_ROWS_F32); }
"""
