"""The name the Tensor mixins use for "a tensor" in their annotations, without importing tensor/tensor.py.

tensor/tensor.py builds `Tensor` from the op mixins (tensor/ops.py, tensor/mathops.py, ...), so a mixin that
imported tensor/tensor.py back, even under `TYPE_CHECKING`, would close an import circle through all of them
(tests/test_layering.py forbids that). Instead a mixin method annotates with `typing.Self`: the class
it is called on, which is `Tensor`. A free helper function has no `Self`; it takes and returns
`AnyTensor`, which a type checker reads as `Any`: such helpers call methods from every mixin, and no
type smaller than `Tensor` itself declares them all. Runtime code in the mixins makes new tensors with
`type(self)(...)` or `self._new(...)`, never by naming `Tensor`.
"""
from __future__ import annotations

from typing import Any, TypeAlias

AnyTensor: TypeAlias = Any  # a Tensor, where `Self` is not available (free functions, staticmethods)
