"""PyTorch as an optional test reference: `torch` is the module, or a stand-in when it is not installed
(so reference functions can still be listed at import), and `needs_torch` skips what compares to it."""
from __future__ import annotations

import pytest


class _Absent:
    """Stands in for PyTorch when it is not installed, so the reference functions can be listed."""
    def __getattr__(self, name):
        return self

    def __call__(self, *args, **kwargs):
        return self


try:
    import torch
except ImportError:  # the comparisons against PyTorch skip; everything else runs
    torch = _Absent()

needs_torch = pytest.mark.skipif(isinstance(torch, _Absent),
                                 reason="PyTorch is the reference here: pip install torch (CPU wheel)")
