"""Packed (quantized) weights: the C of each block format's dot products and decodes (source.py, with
the batch-1 gemv, the blocked gemm, the Q8-activation path and the thread pool in *_c.py), the
library that compiles and binds them (kernels.py), and their numpy reference (numpy_kernels.py)."""
