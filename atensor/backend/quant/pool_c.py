"""The C that runs a packed matmul on several threads, and the kernels' entry points (backend/quant/source.py's
SOURCE ends with it).

Why threads of its own: a batch-1 decode step is matrix-vector products whose time is the decode of
the weight blocks (compute, not memory: ~3 GB/s a thread against ~10 GB/s the memory gives), so two
cores decode twice the blocks. BLAS cannot lend its threads for that (OpenBLAS has no public call to
run a function on its pool), so this file keeps a small pool of workers, started on first use.

How many threads: a kernel's BLAS thread count, the one mechanism atensor has for a kernel's threads
(backend/gemm/blas.py). For a packed matmul the runner sets it to the device's whole share every time
(`blas.packed_threads`: not the timed choice other big kernels make, which on a loaded machine chose
one thread or two by the load of its first runs), and the kernel reads it back through
`openblas_get_num_threads` (backend/quant/kernels.py hands both functions over). The work size then decides: no
split under ATQ_MIN_ROWS_PER_THREAD weight rows a thread. While the pool's threads call sgemm (many
rows on the portable path, backend/quant/source.py's panels), BLAS is set to one thread, so the two kinds of threads never stack; the
count is set back before the kernel returns.

The split: rows of W (the output columns) in chunks of ATQ_CHUNKS_PER_THREAD per thread, a multiple of
16 rows each (a thread's stores do not share a cache line with another's) or of the sgemm panel's rows,
and every thread, the caller too, claims the next chunk until none is left. Why claimed, not one fixed
part per thread: on a shared machine a worker's core is often taken by another process, and a fixed
part made the caller wait for it a scheduler time slice (measured: two threads 2-5x slower than one on
SmolLM2's decode shapes while another process held a core); now the caller runs the chunks such a
worker has not claimed. Each weight block is read by one thread only, each thread writes its own
columns of y, and every row's dot product (or sgemm call) is the one a single thread makes (the batch-1
kernels' grouping of rows does not change a row's result, backend/quant/gemv_c.py): the result is the same as
one thread's, bit for bit.

Invariants: one job at a time (`atq_pool_call`; a second caller, e.g. another CPU device's queue,
runs on its own thread alone); a thread reads a job's arguments only after claiming one of its chunks
(`atq_ticket`), and the caller returns only when every chunk is done, so no thread reads arguments of
a job that has returned; a forked child starts with no workers (pthread_atfork). Idle workers spin
ATQ_SPIN_NS, 1 ms (a decode step's next product comes within tens of microseconds, and a worker woken
from sleep takes tens more, by which time the caller has run the chunks), pausing at first and then
yielding their core between checks (a thread of ours or another process waiting for that core runs),
then sleep on a condition variable.
"""
from __future__ import annotations

POOL_SOURCE = r"""
#include <pthread.h>
#include <sched.h>
#include <time.h>

/* ---- BLAS's thread count: the kernel's threads ---------------------------------------------------- */
typedef int (*atq_get_threads_t)(void);
typedef void (*atq_set_threads_t)(int);
static atq_get_threads_t atq_blas_get;
static atq_set_threads_t atq_blas_set;
void atq_set_blas_threads(void *get, void *set) { atq_blas_get = (atq_get_threads_t)get; atq_blas_set = (atq_set_threads_t)set; }
#define ATQ_MAX_THREADS 16
int atq_threads(void) {
  int n = atq_blas_get != NULL ? atq_blas_get() : 1;
  return n < 1 ? 1 : n > ATQ_MAX_THREADS ? ATQ_MAX_THREADS : n;
}

/* ---- the pool ------------------------------------------------------------------------------------- */
typedef struct {
  atq_rows_fn fn; int fmt; const float *x; const uint8_t *w; float *y; int64_t m, cols, rows, chunk;
} atq_job;
static pthread_mutex_t atq_pool_call = PTHREAD_MUTEX_INITIALIZER;  /* one job at a time */
static pthread_mutex_t atq_pool_lock = PTHREAD_MUTEX_INITIALIZER;  /* guards the sleep on `atq_wake` */
static pthread_cond_t atq_wake = PTHREAD_COND_INITIALIZER;
/* the current job's ticket: generation << 32 | chunks << 16 | next unclaimed chunk (atomics: __atomic
   builtins). A thread owns chunk c of generation g once its compare-and-swap moved `next` from c to c+1
   in g's ticket; it reads `atq_current` only then, so a worker woken late (its job finished, the next
   one being written) touches nothing: it finds next == chunks, or a newer generation */
static uint64_t atq_ticket;
static int64_t atq_done;         /* chunks of the current job finished */
static int atq_started;          /* workers running; only the caller holding atq_pool_call changes it */
static atq_job atq_current;
static uint64_t atq_stats[3];    /* jobs run on the pool, chunks the callers ran, chunks workers ran */
void atq_pool_stats(uint64_t *out) { for (int i = 0; i < 3; i++) out[i] = __atomic_load_n(&atq_stats[i], __ATOMIC_RELAXED); }
#define ATQ_SPIN_NS 1000000
#define ATQ_PAUSES 256  /* a waiting worker's pauses (~2-10 us) before it yields its core between checks */
#define ATQ_MAX_CHUNKS 0xFFFF

static inline void atq_pause(void) {
#ifdef ATQ_X86
  __builtin_ia32_pause();
#endif
}
static uint64_t atq_clock(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* claims and runs chunks of generation `gen` until none is left; returns the chunks run */
static int64_t atq_run_chunks(uint64_t gen) {
  int64_t ran = 0;
  uint64_t t = __atomic_load_n(&atq_ticket, __ATOMIC_ACQUIRE);
  for (;;) {
    uint64_t chunks = (t >> 16) & 0xFFFF, next = t & 0xFFFF;
    if ((t >> 32) != gen || next >= chunks) return ran;
    if (!__atomic_compare_exchange_n(&atq_ticket, &t, t + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) continue;
    const atq_job *job = &atq_current;  /* stable: generation gen cannot finish before this chunk */
    int64_t r0 = (int64_t)next * job->chunk, r1 = r0 + job->chunk < job->rows ? r0 + job->chunk : job->rows;
    if (r0 < r1) job->fn(job->fmt, job->x, job->w, job->y, job->m, job->cols, job->rows, r0, r1);
    __atomic_fetch_add(&atq_done, 1, __ATOMIC_RELEASE);
    ran++;
    t = __atomic_load_n(&atq_ticket, __ATOMIC_ACQUIRE);
  }
}

static void *atq_worker(void *arg) {
  uint64_t seen = (uint64_t)(uintptr_t)arg;  /* the generation when it started: its first job is a later one */
  for (;;) {
    uint64_t start = atq_clock(), gen;
    int spins = 0;
    while ((gen = __atomic_load_n(&atq_ticket, __ATOMIC_ACQUIRE) >> 32) == seen) {
      if (++spins < ATQ_PAUSES) atq_pause(); else sched_yield();  /* a thread of ours waiting for this core runs */
      if (spins % 64 == 0 && atq_clock() - start > ATQ_SPIN_NS) {
        pthread_mutex_lock(&atq_pool_lock);
        while ((gen = __atomic_load_n(&atq_ticket, __ATOMIC_ACQUIRE) >> 32) == seen)
          pthread_cond_wait(&atq_wake, &atq_pool_lock);
        pthread_mutex_unlock(&atq_pool_lock);
        break;
      }
    }
    seen = gen;
    int64_t ran = atq_run_chunks(gen);
    if (ran) __atomic_fetch_add(&atq_stats[2], (uint64_t)ran, __ATOMIC_RELAXED);
  }
  return NULL;
}

/* a child forked from a process with workers has none (fork copies only the calling thread): it starts
   its own, from fresh locks (one held by another thread at the fork would stay held) */
static void atq_after_fork(void) {
  pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
  atq_pool_call = fresh;
  atq_pool_lock = fresh;
  atq_wake = wake;
  atq_started = 0;
}

/* runs `job`'s `chunks` chunks on this thread and on up to parts-1 workers, whichever claims each first:
   a worker that is not running now (another process holds its core, or it sleeps) leaves its chunks to
   the others instead of stalling the job. False (nothing run) when the pool is busy with another
   caller's job or its workers cannot start */
static int atq_pool_run(const atq_job *job, int parts, int64_t chunks) {
  static int registered;
  if (pthread_mutex_trylock(&atq_pool_call) != 0) return 0;
  if (!registered) registered = pthread_atfork(NULL, NULL, atq_after_fork) == 0;
  uint64_t gen = ((__atomic_load_n(&atq_ticket, __ATOMIC_RELAXED) >> 32) + 1) & 0xFFFFFFFFu;  /* wraps as the field */
  while (atq_started < parts - 1) {
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int failed = pthread_create(&thread, &attr, atq_worker, (void *)(uintptr_t)((gen - 1) & 0xFFFFFFFFu));
    pthread_attr_destroy(&attr);
    if (failed) break;
    atq_started++;
  }
  if (atq_started < parts - 1) { pthread_mutex_unlock(&atq_pool_call); return 0; }
  atq_current = *job;
  __atomic_store_n(&atq_done, 0, __ATOMIC_RELAXED);
  pthread_mutex_lock(&atq_pool_lock);  /* a worker between its check and its wait sees the new generation */
  __atomic_store_n(&atq_ticket, gen << 32 | (uint64_t)chunks << 16, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&atq_wake);
  pthread_mutex_unlock(&atq_pool_lock);
  int64_t ran = atq_run_chunks(gen);
  __atomic_fetch_add(&atq_stats[0], 1, __ATOMIC_RELAXED);
  __atomic_fetch_add(&atq_stats[1], (uint64_t)ran, __ATOMIC_RELAXED);
  for (int spins = 0; __atomic_load_n(&atq_done, __ATOMIC_ACQUIRE) < chunks; spins++) {  /* a worker's last chunk */
    if (spins < 4096) atq_pause(); else sched_yield();
  }
  pthread_mutex_unlock(&atq_pool_call);
  return 1;
}

/* ---- the entry points ------------------------------------------------------------------------------
   y (m, rows) = x (m, cols) . W^T, W packed (rows, cols), through `variant` (backend/quant/variants_c.py's table; -1: the family's
   selection) on `threads` threads; `fmt` with
   ATQ_Q8ACT set: x's rows quantized to Q8_0 first (backend/quant/q8_c.py) */
#define ATQ_MIN_ROWS_PER_THREAD 64  /* fewer rows a thread: one thread (the split would cost more than it saves) */
#define ATQ_CHUNKS_PER_THREAD 4     /* chunks per thread, claimed in turn: a late thread takes fewer */
#define ATQ_MIN_ROWS_PER_CHUNK 32
static void atq_matmul_split(atq_rows_fn fn, int fmt, const float *x, const uint8_t *w, float *y, int64_t m,
                             int64_t cols, int64_t rows, int threads, int may_gemm);
/* the family of a call (backend/quant/variants_c.py): Q8 activations only for the block formats (F16 and
   BF16 weights keep float32 activations) */
static int atq_call_q8(int fmt) { return (fmt & ATQ_Q8ACT) && (fmt & ~ATQ_Q8ACT) <= ATQ_Q8_0; }
int atq_call_family(int fmt, int64_t m) { return atq_family_of(atq_call_q8(fmt), m); }
void atq_matmul_run(int variant, int fmt, const float *x, const uint8_t *w, float *y, int64_t m, int64_t cols,
                    int64_t rows, int threads) {
  int q8 = atq_call_q8(fmt);
  fmt &= ~ATQ_Q8ACT;
  void *quantized = NULL;
  if (q8) {  /* x's rows quantized once, here; the rows functions read the blocks where x was */
    quantized = malloc(sizeof(atq_xblock) * (size_t)(m * (cols / 32)));
    if (quantized == NULL) q8 = 0;  /* no memory for the blocks: the float32 kernel, whose results are exact */
    else { atq_quantize_x(x, (atq_xblock *)quantized, m, cols); x = (const float *)quantized; }
  }
  int family = atq_family_of(q8, m);  /* a variant of another family (or none, -1): this family's selection */
  if (variant < 0 || variant >= ATQ_VARIANTS || atq_variants[variant].family != family || !atq_variant_supported(variant))
    variant = atq_selection(family);
  atq_count_call(variant);
  const atq_variant *v = &atq_variants[variant];
  int blocked = cols % 32 == 0 && cols <= v->blocked_cols;
  atq_matmul_split(v->rows, fmt, x, w, y, m, cols, rows, threads, !q8 && !blocked);
  free(quantized);
}

/* the time of `calls` calls of variant v on these operands, in nanoseconds of wall time (atensor/tune/'s
   trials: the kernel alone, without the ctypes call around each) */
double atq_time_variant(int variant, int fmt, const float *x, const uint8_t *w, float *y, int64_t m, int64_t cols,
                        int64_t rows, int threads, int calls) {
  uint64_t start = atq_clock();
  for (int i = 0; i < calls; i++) atq_matmul_run(variant, fmt, x, w, y, m, cols, rows, threads);
  return (double)(atq_clock() - start);
}

static void atq_matmul_split(atq_rows_fn fn, int fmt, const float *x, const uint8_t *w, float *y, int64_t m,
                             int64_t cols, int64_t rows, int threads, int may_gemm) {
  int parts = threads < 1 ? 1 : threads > ATQ_MAX_THREADS ? ATQ_MAX_THREADS : threads;
  while (parts > 1 && rows / parts < ATQ_MIN_ROWS_PER_THREAD) parts--;
  if (parts > 1) {
    int gemm = may_gemm && m >= ATQ_GEMM_ROWS && cols <= ATQ_SCRATCH && atq_sgemm != NULL;  /* backend/quant/source.py's panels */
    int64_t unit = gemm ? atq_panel_rows(cols) : 16;
    int64_t chunk = (rows + ATQ_CHUNKS_PER_THREAD * parts - 1) / (ATQ_CHUNKS_PER_THREAD * parts);
    chunk = chunk < ATQ_MIN_ROWS_PER_CHUNK ? ATQ_MIN_ROWS_PER_CHUNK : chunk;
    chunk = (chunk + unit - 1) / unit * unit;  /* whole panels: the same sgemm calls as on one thread */
    if ((rows + chunk - 1) / chunk > ATQ_MAX_CHUNKS) chunk = ((rows + ATQ_MAX_CHUNKS - 1) / ATQ_MAX_CHUNKS + unit - 1) / unit * unit;
    int64_t chunks = (rows + chunk - 1) / chunk;
    atq_job job = {fn, fmt, x, w, y, m, cols, rows, chunk};
    int blas_threads = gemm && atq_blas_set != NULL ? atq_threads() : 1;
    if (blas_threads > 1) atq_blas_set(1);  /* each thread's sgemm on its own thread */
    int done = chunks > 1 && atq_pool_run(&job, parts, chunks);
    if (blas_threads > 1) atq_blas_set(blas_threads);
    if (done) return;
  }
  fn(fmt, x, w, y, m, cols, rows, 0, rows);
}

/* a QMATMUL kernel's call (backend/c/prelude.py's at_packed_qmatmul): its family's selected variant, on the
   kernel's BLAS threads */
void atq_matmul(int fmt, const float *x, const uint8_t *w, float *y, int64_t m, int64_t cols, int64_t rows) {
  atq_matmul_run(-1, fmt, x, w, y, m, cols, rows, atq_threads());
}
/* a decode through variant v of the dequant family (-1: its selection) */
void atq_dequant_run(int variant, int fmt, const uint8_t *w, float *out, int64_t rows, int64_t cols) {
  if (variant < 0 || variant >= ATQ_VARIANTS || atq_variants[variant].family != ATQ_DEQUANT ||
      !atq_variant_supported(variant))
    variant = atq_selection(ATQ_DEQUANT);
  atq_count_call(variant);
  atq_variants[variant].dequant(fmt, w, out, rows, cols);
}
void atq_dequant(int fmt, const uint8_t *w, float *out, int64_t rows, int64_t cols) {
  atq_dequant_run(-1, fmt, w, out, rows, cols);
}
"""
