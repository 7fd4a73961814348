"""numpy's integer and float semantics (graph/semantics.py) as C helpers, one text for every compiler
that lowers the C renderer's expressions: the host's (backend/c/prelude.py) and the OpenCL device's
(backend/gpu/dialect.py). Why one text: the rules (NaN-propagating max, floor division and modulo signed like
the divisor, 0 on division by zero, float modulo with the divisor's sign) were written twice, once per
prelude, and a fix to one could miss the other.

The text is plain C99 that OpenCL C also accepts, given that the OpenCL prelude maps the libm names it
calls (`fmodf`, `copysignf`) onto OpenCL's overloaded ones; `DOUBLE_HELPERS` is kept apart because an
OpenCL device may lack doubles (its prelude guards it with cl_khr_fp64).

Changing this text changes the cache key of every native library and every OpenCL program: all are
compiled again once.
"""

SEMANTIC_HELPERS = r"""
#define AT_FMAX(a, b) (((a) != (a) || (a) > (b)) ? (a) : (b))
#define AT_IMAX(a, b) ((a) > (b) ? (a) : (b))
static inline int64_t at_idiv(int64_t a, int64_t b) {
  if (b == 0) return 0;
  if (b == -1) return (int64_t)(0 - (uint64_t)a);
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
  return q;
}
static inline int64_t at_imod(int64_t a, int64_t b) {
  if (b == 0 || b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
static inline uint64_t at_udiv(uint64_t a, uint64_t b) { return b == 0 ? 0 : a / b; }
static inline uint64_t at_umod(uint64_t a, uint64_t b) { return b == 0 ? 0 : a % b; }
static inline float at_fmodf(float a, float b) {
  float r = fmodf(a, b);
  if (r != 0) { if ((r < 0) != (b < 0)) r += b; } else r = copysignf(0.0f, b);
  return r;
}
"""

# the double-precision float modulo, separate: an OpenCL device may have no doubles
DOUBLE_HELPERS = r"""
static inline double at_fmod(double a, double b) {
  double r = fmod(a, b);
  if (r != 0) { if ((r < 0) != (b < 0)) r += b; } else r = copysign(0.0, b);
  return r;
}
"""

__all__ = ["DOUBLE_HELPERS", "SEMANTIC_HELPERS"]
