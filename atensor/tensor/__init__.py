"""The Tensor and its op families, one module per kind of op.

`Tensor` (tensor.py) holds storage, realize and the sync accessors; its methods come from mixins grouped
by kind: creation, elementwise math, reductions, movement, indexing, windows (convolution and pooling),
contractions, neural-network functions, autograd, multi-device and random draws. Nothing here runs:
every method builds graph nodes, and `realize()` hands them to engine/.
"""
from atensor.tensor.tensor import NotRealizedError, Tensor

__all__ = ["NotRealizedError", "Tensor"]
