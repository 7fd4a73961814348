"""The C every native library starts with (backend/c/registry.py compiles it ahead of the rendered kernels).

- numpy's integer and float semantics as helpers (floor division and modulo signed like the divisor,
  0 on division by zero, NaN-propagating max) and the BLAS gemm and gemv pointers numpy's OpenBLAS
  provides;
- the program runner (backend/c/programs.py `Program`): a list of run / wait / publish operations, the waits and
  publishes on C timelines (a value and a futex word per queue), so queues hand work to each other
  without the GIL or a Python wake-up;
- `atensor_copy`, a memcpy between buffers that a program can hold;
- `at_sgemm_rows`, the product of 1..4 rows with a matrix (W^T), reading the matrix once, and
  `at_sgemm_rows_nn`, the same with B (k x n) for a matrix in cache (backend/gemm/c_blas.py);
- the pointers to the packed-weight kernels (backend/quant/source.py) that QMATMUL and DEQUANT kernels call;
- under AT_MVEC (c_flags.vector_math), libm's expf, logf, sinf, cosf (and double versions) declared
  `omp declare simd`, so a vectorized loop calls libmvec's 8-lane versions.
Changing it changes every library's cache key: everything is compiled again once. Its numpy-semantics
helpers are backend/c/helpers.py's, shared with the OpenCL prelude.
"""
from atensor.backend.c.flags import MVEC_DECLARATIONS
from atensor.backend.c.helpers import DOUBLE_HELPERS, SEMANTIC_HELPERS

PRELUDE = r"""
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#ifdef AT_MVEC
""" + MVEC_DECLARATIONS + r"""#endif
#include <stdatomic.h>
#include <sched.h>
#include <time.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#ifdef ATENSOR_ILP64
typedef long long blasint;
#else
typedef int blasint;
#endif
typedef void (*sgemm_t)(int, int, int, blasint, blasint, blasint, float, const float *, blasint,
                        const float *, blasint, float, float *, blasint);
typedef void (*dgemm_t)(int, int, int, blasint, blasint, blasint, double, const double *, blasint,
                        const double *, blasint, double, double *, blasint);
typedef void (*sgemv_t)(int, int, blasint, blasint, float, const float *, blasint, const float *, blasint,
                        float, float *, blasint);
typedef void (*dgemv_t)(int, int, blasint, blasint, double, const double *, blasint, const double *, blasint,
                        double, double *, blasint);
static sgemm_t at_sgemm;
static dgemm_t at_dgemm;
static sgemv_t at_sgemv;
static dgemv_t at_dgemv;
typedef void (*set_threads_t)(int);
static set_threads_t at_set_threads;  /* openblas_set_num_threads of the BLAS above, or NULL */
void atensor_set_blas(void *s, void *d, void *sv, void *dv, void *threads) {
  at_sgemm = (sgemm_t)s; at_dgemm = (dgemm_t)d; at_sgemv = (sgemv_t)sv; at_dgemv = (dgemv_t)dv;
  at_set_threads = (set_threads_t)threads;
}
/* C = A . W^T for 2..4 rows of A (m x k, k contiguous) and W (n x k, k contiguous): nn.Linear's
   product for a few rows. OpenBLAS's gemm packs W before it multiplies, which for so few rows costs as
   much as the product; this reads each row of W once, while the rows of A stay in L1
   (c_blas.rows_plan), 8 lanes at a time (GCC/Clang vector types: any ISA). */
typedef float at_v8 __attribute__((vector_size(32)));
static inline at_v8 at_load8(const float *p) { at_v8 v; memcpy(&v, p, sizeof v); return v; }
static inline float at_hsum8(at_v8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}
#define AT_ROWS_KERNEL(M)                                                                         \
  static void at_sgemm_rows##M(int64_t n, int64_t k, const float *a, int64_t lda, const float *w, \
                               int64_t ldw, float *c, int64_t ldc) {                              \
    for (int64_t j = 0; j < n; j++) {                                                             \
      const float *wj = w + j * ldw;                                                              \
      at_v8 acc[M];                                                                               \
      for (int i = 0; i < M; i++) acc[i] = (at_v8){0};                                            \
      int64_t p = 0;                                                                              \
      for (; p + 8 <= k; p += 8) {                                                                \
        at_v8 wv = at_load8(wj + p);                                                              \
        for (int i = 0; i < M; i++) acc[i] += at_load8(a + i * lda + p) * wv;                     \
      }                                                                                           \
      for (int i = 0; i < M; i++) {                                                               \
        float s = at_hsum8(acc[i]);                                                               \
        for (int64_t q = p; q < k; q++) s += a[i * lda + q] * wj[q];                              \
        c[i * ldc + j] = s;                                                                       \
      }                                                                                           \
    }                                                                                             \
  }
AT_ROWS_KERNEL(1)
AT_ROWS_KERNEL(2)
AT_ROWS_KERNEL(3)
AT_ROWS_KERNEL(4)
static inline void at_sgemm_rows(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                                 const float *w, int64_t ldw, float *c, int64_t ldc) {
  if (m == 1) at_sgemm_rows1(n, k, a, lda, w, ldw, c, ldc);
  else if (m == 2) at_sgemm_rows2(n, k, a, lda, w, ldw, c, ldc);
  else if (m == 3) at_sgemm_rows3(n, k, a, lda, w, ldw, c, ldc);
  else at_sgemm_rows4(n, k, a, lda, w, ldw, c, ldc);
}
/* C = A . B for 1..4 rows of A (m x k, k contiguous) and B (k x n, n contiguous) small enough for
   cache: attention's probabilities times its values block at decode (c_blas.small_plan). OpenBLAS
   costs a call per row there (a few microseconds per head, measured); this keeps 16 columns of each
   row of C in registers while it walks k, each output summed in the order p = 0, 1, ..., k-1. */
#define AT_ROWS_NN_KERNEL(M)                                                                      \
  static void at_sgemm_rows_nn##M(int64_t n, int64_t k, const float *a, int64_t lda,              \
                                  const float *b, int64_t ldb, float *c, int64_t ldc) {           \
    int64_t j = 0;                                                                                \
    for (; j + 16 <= n; j += 16) {                                                                \
      at_v8 lo[M], hi[M];                                                                         \
      for (int i = 0; i < M; i++) lo[i] = hi[i] = (at_v8){0};                                     \
      for (int64_t p = 0; p < k; p++) {                                                           \
        at_v8 b0 = at_load8(b + p * ldb + j), b1 = at_load8(b + p * ldb + j + 8);                 \
        for (int i = 0; i < M; i++) {                                                             \
          lo[i] += a[i * lda + p] * b0;                                                           \
          hi[i] += a[i * lda + p] * b1;                                                           \
        }                                                                                         \
      }                                                                                           \
      for (int i = 0; i < M; i++) {                                                               \
        memcpy(c + i * ldc + j, &lo[i], sizeof lo[i]);                                            \
        memcpy(c + i * ldc + j + 8, &hi[i], sizeof hi[i]);                                        \
      }                                                                                           \
    }                                                                                             \
    for (; j < n; j++)                                                                            \
      for (int i = 0; i < M; i++) {                                                               \
        float s = 0;                                                                              \
        for (int64_t p = 0; p < k; p++) s += a[i * lda + p] * b[p * ldb + j];                     \
        c[i * ldc + j] = s;                                                                       \
      }                                                                                           \
  }
AT_ROWS_NN_KERNEL(1)
AT_ROWS_NN_KERNEL(2)
AT_ROWS_NN_KERNEL(3)
AT_ROWS_NN_KERNEL(4)
static inline void at_sgemm_rows_nn(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                                    const float *b, int64_t ldb, float *c, int64_t ldc) {
  if (m == 1) at_sgemm_rows_nn1(n, k, a, lda, b, ldb, c, ldc);
  else if (m == 2) at_sgemm_rows_nn2(n, k, a, lda, b, ldb, c, ldc);
  else if (m == 3) at_sgemm_rows_nn3(n, k, a, lda, b, ldb, c, ldc);
  else at_sgemm_rows_nn4(n, k, a, lda, b, ldb, c, ldc);
}
/* the packed-weight kernels (backend/quant/source.py), in a helper library: backend/quant/kernels.py sets these when it loads a
   library whose kernels call them (a QMATMUL or DEQUANT kernel, backend/c/render.py) */
typedef void (*at_qmatmul_t)(int, const float *, const uint8_t *, float *, int64_t, int64_t, int64_t);
typedef void (*at_dequant_t)(int, const uint8_t *, float *, int64_t, int64_t);
static at_qmatmul_t at_packed_qmatmul;
static at_dequant_t at_packed_dequant;
void atensor_set_quant(void *matmul, void *dequant) {
  at_packed_qmatmul = (at_qmatmul_t)matmul; at_packed_dequant = (at_dequant_t)dequant;
}
typedef void (*at_kernel_t)(void **);
/* timelines of native programs (backend/c/programs.py): a queue's value, and a futex word for sleeping waiters */
typedef struct { _Atomic uint64_t value; _Atomic uint32_t seq; _Atomic uint32_t sleepers; } at_timeline;
static void at_timeline_wait(at_timeline *t, uint64_t target) {
  for (int spin = 0; spin < 256; spin++) {  /* a few microseconds: the other queue is often about done */
    if (atomic_load(&t->value) >= target) return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  while (atomic_load(&t->value) < target) {
#ifdef __linux__
    uint32_t seq = atomic_load(&t->seq);
    atomic_fetch_add(&t->sleepers, 1);
    if (atomic_load(&t->value) < target)  /* sleeps unless `seq` moved since it was read */
      syscall(SYS_futex, (uint32_t *)&t->seq, FUTEX_WAIT_PRIVATE, seq, NULL, NULL, 0);
    atomic_fetch_sub(&t->sleepers, 1);
#else
    sched_yield();
#endif
  }
}
static void at_timeline_publish(at_timeline *t, uint64_t value) {
  atomic_store(&t->value, value);
  atomic_fetch_add(&t->seq, 1);
#ifdef __linux__
  if (atomic_load(&t->sleepers))
    syscall(SYS_futex, (uint32_t *)&t->seq, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
#endif
}
static inline uint64_t at_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
/* ops[4i..4i+3] = (kind, timeline, queue, offset): 0 runs fns[i](blocks[i]); 1 waits until
   timelines[timeline] reaches bases[queue] + offset; 2 publishes that value. A run op's second field
   is its BLAS thread count: above 1 the count is set for the run and set back to 1 after it (the
   one-thread invariant of engine/lower.py); when its third field is 1 the run is measured: its
   nanoseconds are written into its fourth field, which the plan reads back for blas.MeasuredThreads */
void atensor_run_program(long long n, int64_t *ops, void **fns, void **blocks, const uint64_t *bases,
                         at_timeline *timelines) {
  /* one thread unless a run op says otherwise: a numpy kernel may have left more (engine/lower.py), and
     a program a worker starts from its doorbell runs without Python setting the count first */
  if (at_set_threads) at_set_threads(1);
  for (long long i = 0; i < n; i++) {
    int64_t *op = ops + 4 * i;
    if (op[0] == 0) {
      int many = op[1] > 1 && at_set_threads;
      uint64_t start = op[2] ? at_now() : 0;  /* a measured run: its time, whatever its threads */
      if (many) at_set_threads((int)op[1]);
      ((at_kernel_t)fns[i])((void **)blocks[i]);
      if (many) at_set_threads(1);
      if (op[2]) op[3] = (int64_t)(at_now() - start);
    }
    else if (op[0] == 1) at_timeline_wait(&timelines[op[1]], bases[op[2]] + (uint64_t)op[3]);
    else at_timeline_publish(&timelines[op[1]], bases[op[2]] + (uint64_t)op[3]);
  }
}
/* a queue's doorbell (doorbell.py): the command lists posted to the queue, counted, and the arguments
   of each list that is one native program, so the worker starts it without taking the GIL */
#define AT_RING 64
typedef struct {
  uint64_t seq; long long n; int64_t *ops; void **fns; void **blocks; const uint64_t *bases;
  at_timeline *timelines;
} at_ring_slot;
typedef struct {
  _Atomic uint64_t posted; _Atomic uint64_t taken; _Atomic uint32_t seq; _Atomic uint32_t sleepers;
  at_ring_slot slots[AT_RING];
} at_ring;
long long atensor_ring_size(void) { return (long long)sizeof(at_ring); }
/* the host posts one list: a program's arguments (n >= 0) or n = -1 for a list the worker runs in
   Python; a program that finds the ring full is run in Python too (returns 0) */
int atensor_ring_post(at_ring *r, long long n, int64_t *ops, void **fns, void **blocks,
                      const uint64_t *bases, at_timeline *timelines) {
  uint64_t posted = atomic_load(&r->posted);
  int placed = 0;
  if (n >= 0 && posted - atomic_load(&r->taken) < AT_RING - 1) {
    at_ring_slot *s = &r->slots[posted % AT_RING];
    s->n = n; s->ops = ops; s->fns = fns; s->blocks = blocks; s->bases = bases; s->timelines = timelines;
    s->seq = posted + 1;  /* valid for list number `posted` only */
    placed = 1;
  }
  atomic_store(&r->posted, posted + 1);
  atomic_fetch_add(&r->seq, 1);
#ifdef __linux__
  if (atomic_load(&r->sleepers))
    syscall(SYS_futex, (uint32_t *)&r->seq, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
#endif
  return placed;
}
void atensor_run_program(long long n, int64_t *ops, void **fns, void **blocks, const uint64_t *bases,
                         at_timeline *timelines);
/* the worker (GIL released) waits for the next list; when it is a program in the ring, runs it and
   stamps it (stamps[0..1], CLOCK_MONOTONIC ns) and returns 1; returns 0 for a list to run in Python */
int atensor_ring_next(at_ring *r, uint64_t *stamps) {
  uint64_t taken = atomic_load(&r->taken);
  for (int spin = 0; atomic_load(&r->posted) <= taken; spin++) {
    if (spin < 256) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      continue;
    }
#ifdef __linux__
    uint32_t seq = atomic_load(&r->seq);
    atomic_fetch_add(&r->sleepers, 1);
    if (atomic_load(&r->posted) <= taken)  /* sleeps unless a list was posted since `seq` was read */
      syscall(SYS_futex, (uint32_t *)&r->seq, FUTEX_WAIT_PRIVATE, seq, NULL, NULL, 0);
    atomic_fetch_sub(&r->sleepers, 1);
#else
    sched_yield();
#endif
  }
  at_ring_slot *s = &r->slots[taken % AT_RING];
  int ran = 0;
  if (s->seq == taken + 1) {
    stamps[0] = at_now();
    atensor_run_program(s->n, s->ops, s->fns, s->blocks, s->bases, s->timelines);
    stamps[1] = at_now();
    ran = 1;
  }
  atomic_store(&r->taken, taken + 1);
  return ran;
}
/* whether the worker is done with the first `count` lists posted (doorbell.py `Doorbell.finished`):
   `taken` is stored once a list's program has run, so a program in the ring has finished when it is
   counted; an acquire load, so its writes are visible to the caller that sees the count */
int atensor_ring_done(at_ring *r, unsigned long long count) {
  return atomic_load_explicit(&r->taken, memory_order_acquire) >= count;
}
/* a copy between buffers: b = {dst, src, nbytes} */
void atensor_copy(void **b) { memcpy(b[0], b[1], (size_t)(uintptr_t)b[2]); }
/* GCC 12.2's loop vectorizer miscompiles a reduction whose inner loop reads with a negative step
   (a flipped axis): sum(flip(x, 1) * 2) over a 3x2 array adds one element twice, at -O3 and even at
   -O2, while the source has no undefined behaviour (all indices in range, no aliasing, clean under
   -fsanitize=undefined,address). Kernels that read or write with a negative stride are compiled
   without loop vectorization (backend/c/render.py marks them); every other kernel keeps it, since it is
   worth about 4x on elementwise loops in cache. tests/backend/test_native.py holds the repro. */
#if defined(__GNUC__) && !defined(__clang__)
#define AT_NEGATIVE_STEPS __attribute__((optimize("no-tree-loop-vectorize")))
#else
#define AT_NEGATIVE_STEPS
#endif
""" + SEMANTIC_HELPERS.lstrip("\n") + DOUBLE_HELPERS.lstrip("\n")
