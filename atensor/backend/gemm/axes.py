"""Which axes of a contraction sum(a * b, axes) are a gemm's batch, rows, inner and columns.

Why apart: both the numpy backend's contraction (backend/gemm/contraction.py, which imports the C helpers of
backend/gemm/window_c.py and so backend/c/library.py) and the C renderer (backend/c/render.py, imported by backend/c/registry.py)
classify a contraction's axes the same way; a module of its own keeps that one definition without an
import circle.
"""
from __future__ import annotations

from atensor.graph.view import View


def contraction_groups(a_view: View, b_view: View, axes: tuple[int, ...]) -> tuple[list[int], ...]:
    """The axes of sum(a * b, axes), a and b broadcast views, as (batch, rows, inner, cols): axes in
    both operands that are kept, only in a, in both and reduced, only in b (axes in neither, or of
    size 1, in none)."""
    shape = a_view.shape
    ra = [i for i in range(len(shape)) if a_view.strides[i] != 0 and shape[i] != 1]
    rb = [i for i in range(len(shape)) if b_view.strides[i] != 0 and shape[i] != 1]
    in_a, in_b = set(ra), set(rb)
    batch = [i for i in ra if i in in_b and i not in axes]
    rows = [i for i in ra if i not in in_b]
    inner = [i for i in ra if i in in_b and i in axes]
    cols = [i for i in rb if i not in in_a]
    return batch, rows, inner, cols


__all__ = ["contraction_groups"]
