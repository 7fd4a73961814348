"""Backends: how a scheduled kernel becomes something a queue can run.

Why folders by job: a kernel reaches a queue through one of a few lowerings, and each has its own
concepts, which a reader learns in one place:

- `c/`: the native tier: the C renderer, its prelude and flags, the compiler, the library cache, the
  kernel registry and the native programs that run its kernels (and the one-call replay's C);
- `numpy/`: the numpy tier: each kernel rendered once into a Python function over numpy, with the
  plans it makes at render time;
- `gemm/`: matrix products: BLAS threads, calls and addresses, the GEMM lowerings of contractions, convolution
  windows;
- `quant/`: packed (quantized) weights: the C kernels of each block format, their numpy reference, and
  the library that binds them;
- `gpu/`: the data-parallel renderer and the dialect records of GPU kernel languages (OpenCL).

`runner.py` stays here: the typed record every lowering produces and every queue runs.
"""
