"""What differs between GPU kernel languages, as one record per language: address spaces, thread ids,
barriers, how a kernel is declared, and the prelude of helpers the shared renderer's code calls.

Why a record: backend/gpu/render.py lowers a kernel AST to data-parallel kernels once, for any such language;
OpenCL C, CUDA and Metal differ in spelling, not in structure (CUDA would be `extern "C" __global__
void`, no global qualifier, `__shared__`, `blockIdx.x * blockDim.x + threadIdx.x`, `__syncthreads()`).
Adding a language is adding a record, not a renderer.

The helpers keep the semantics of the C backend (graph/semantics.py): NaN-propagating max, floor
division and divisor-signed modulo for integers (0 when dividing by 0), float modulo with the divisor's
sign: the same text as the C prelude's (backend/c/helpers.py), with OpenCL's names for the libm functions it calls.
"""
from __future__ import annotations

from dataclasses import dataclass

from atensor.backend.c.helpers import DOUBLE_HELPERS, SEMANTIC_HELPERS


@dataclass(frozen=True)
class Dialect:
    """The spelling of one GPU kernel language (see the module docstring)."""
    name: str
    kernel: str            # what starts a kernel's declaration, before its name
    global_space: str      # qualifier of a pointer to device memory
    local_space: str       # qualifier of an array shared by a work-group
    global_id: str         # the work-item's index in the whole launch (dimension 0)
    group_id: str          # the work-group's index
    local_id: str          # the work-item's index in its work-group
    barrier: str           # a work-group barrier over shared memory (a statement)
    long_type: str         # a 64-bit integer scalar argument
    prelude: str           # fixed-width integer names, the math names the C templates use, helpers


_OPENCL_PRELUDE = r"""
#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
typedef char int8_t;
typedef uchar uint8_t;
typedef short int16_t;
typedef ushort uint16_t;
typedef int int32_t;
typedef uint uint32_t;
typedef long int64_t;
typedef ulong uint64_t;
/* the C renderer's libm names; OpenCL C's math functions are overloaded by type */
#define sqrtf sqrt
#define expf exp
#define logf log
#define sinf sin
#define cosf cos
#define exp2f exp2
#define log2f log2
#define truncf trunc
#define powf pow
#define fmodf fmod
#define copysignf copysign
/* pocl's float tanh never reaches 1: tanh(10), even tanh(INFINITY), is 1 - 2^-24, so gelu's gradient
   at x = 350 was 1.28 where PyTorch and the C backend give 1 (1 - tanh^2 times a huge slope). A float
   rounds tanh(x) to +-1 from |x| = 9.0109 on: from there it is +-1, as libm's tanhf gives */
static inline float at_tanhf(float x) { return fabs(x) >= 9.02f ? copysign(1.0f, x) : tanh(x); }
#define tanhf at_tanhf
""" + SEMANTIC_HELPERS.lstrip("\n") + "#ifdef cl_khr_fp64\n" + DOUBLE_HELPERS.lstrip("\n") + "#endif\n"

OPENCL = Dialect(name="OpenCL C", kernel="__kernel void", global_space="__global", local_space="__local",
                 global_id="get_global_id(0)", group_id="get_group_id(0)", local_id="get_local_id(0)",
                 barrier="barrier(CLK_LOCAL_MEM_FENCE);", long_type="long", prelude=_OPENCL_PRELUDE)

__all__ = ["Dialect", "OPENCL"]
