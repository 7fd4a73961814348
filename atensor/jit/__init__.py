"""The jit: capture a function of Tensors once, replay its captured programs on later calls.

It sits above `atensor.tensor` (it flattens Tensor arguments and wraps its results in Tensors) and
below `nn/` and `models/`, which may jit their steps.
"""
from atensor.jit.jit import Jit, JitError, JitWarning, TinyJit, jit

__all__ = ["Jit", "JitError", "JitWarning", "TinyJit", "jit"]
