"""Elementwise functions without a graph op of their own: inverse trigonometric and hyperbolic
functions, log10, copysign, fmod, logaddexp, and the activation functions tinygrad and PyTorch name.

Each is a composition of existing ops, so its gradient comes from the ops' rules. asin is
Abramowitz-Stegun 4.4.46 (pi/2 - sqrt(1 - |x|) * a degree-7 polynomial, absolute error below 2e-8,
tinygrad's choice); acos and atan are built from it. The hyperbolic inverses use the log forms, with
|x| and the sign split off where the direct form would cancel badly for negative x.
"""
from __future__ import annotations

import math
from typing import Any, Self

from atensor.dtype import dtypes, least_upper_float
from atensor.tensor.ops import TensorOps


_ASIN = (-0.0012624911, 0.0066700901, -0.0170881256, 0.0308918810, -0.0501743046, 0.0889789874,
         -0.2145988016, 1.5707963050)
_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def _poly(x: Any, coefficients: tuple[float, ...]) -> Any:
    """Horner's rule, highest power first."""
    out = x * 0 + coefficients[0]
    for c in coefficients[1:]:
        out = out * x + c
    return out


class ActivationOps:
    """Elementwise math and activation methods of Tensor (a mixin)."""
    __slots__ = ()

    def _as_float(self) -> Self:
        return self.cast(least_upper_float(self.dtype))

    # ---- inverse trigonometric and hyperbolic ------------------------------------------------------
    def asin(self) -> Self:
        """arcsin, for x in [-1, 1] (NaN outside)."""
        x = self._as_float()
        a = x.abs()
        return x.sign() * (math.pi / 2 - (1.0 - a).sqrt() * _poly(a, _ASIN))

    def acos(self) -> Self:
        """arccos, for x in [-1, 1]."""
        return math.pi / 2 - self.asin()

    def atan(self) -> Self:
        """arctan: asin(x / sqrt(1 + x^2))."""
        x = self._as_float()
        return (x / (x * x + 1).sqrt()).asin()

    def sinh(self) -> Self:
        """(e^x - e^-x) / 2."""
        x = self._as_float()
        return (x.exp() - (-x).exp()) * 0.5

    def cosh(self) -> Self:
        """(e^x + e^-x) / 2."""
        x = self._as_float()
        return (x.exp() + (-x).exp()) * 0.5

    def asinh(self) -> Self:
        """sign(x) * log(|x| + sqrt(x^2 + 1))."""
        x = self._as_float()
        a = x.abs()
        return x.sign() * (a + (a * a + 1).sqrt()).log()

    def acosh(self) -> Self:
        """log(x + sqrt(x^2 - 1)), for x >= 1."""
        x = self._as_float()
        return (x + (x * x - 1).sqrt()).log()

    def atanh(self) -> Self:
        """log((1 + x) / (1 - x)) / 2, for x in (-1, 1)."""
        x = self._as_float()
        return ((1 + x) / (1 - x)).log() * 0.5

    def log10(self) -> Self:
        """Base-10 logarithm."""
        return self._as_float().log2() * math.log10(2)

    # ---- two-operand helpers -----------------------------------------------------------------------
    def copysign(self, other: Any) -> Self:
        """|self| with the sign of `other` (a -0.0 counts as negative, as in C and PyTorch)."""
        x = self._as_float()
        o = other if isinstance(other, TensorOps) else x._const_like(float(other))
        negative = (o < 0) | ((o == 0) & ((1 / o) < 0))
        a = x.abs()
        return negative.where(-a, a)

    def fmod(self, other: Any) -> Self:
        """C's fmod: the remainder with the sign of the dividend, self - trunc(self / other) * other."""
        if dtypes.is_int(self.dtype) and not (isinstance(other, TensorOps) and dtypes.is_float(other.dtype)) \
                and not isinstance(other, float):
            return self - self.div(other, rounding_mode="trunc") * other
        x = self._as_float()
        return x - x.div(other, rounding_mode="trunc") * other

    def logaddexp(self, other: Any) -> Self:
        """log(e^self + e^other), computed around the larger of the two."""
        x = self._as_float()
        m = x.maximum(other).detach()
        m = m.isinf().where(m._const_like(0.0), m)
        return ((x - m).exp() + (other - m).exp()).log() + m

    # ---- activations ---------------------------------------------------------------------------------
    def softsign(self) -> Self:
        """x / (1 + |x|)."""
        x = self._as_float()
        return x / (1 + x.abs())

    def quick_gelu(self) -> Self:
        """x * sigmoid(1.702 x), the GELU approximation of CLIP."""
        return self * (self * 1.702).sigmoid()

    def hardsigmoid(self, alpha: float = 1 / 6, beta: float = 0.5) -> Self:
        """max(0, min(1, alpha * x + beta)); PyTorch's slope 1/6 and offset 1/2 by default."""
        y = self._as_float() * alpha + beta
        return y.relu() - (y - 1).relu()

    def hardswish(self) -> Self:
        """x * relu6(x + 3) / 6."""
        x = self._as_float()
        return x * (x + 3).relu6() * (1 / 6)

    def selu(self, alpha: float = _SELU_ALPHA, gamma: float = _SELU_SCALE) -> Self:
        """gamma * (x where positive, else alpha * (e^x - 1)), with the self-normalizing constants."""
        x = self._as_float()
        return gamma * (x > 0).where(x, alpha * (x.exp() - 1))

    def celu(self, alpha: float = 1.0) -> Self:
        """max(0, x) + min(0, alpha * (e^(x / alpha) - 1))."""
        x = self._as_float()
        return x.maximum(0) + (alpha * ((x / alpha).exp() - 1)).minimum(0)

    def logsigmoid(self) -> Self:
        """log(sigmoid(x)) = -softplus(-x), computed without overflow."""
        return -(-self).softplus()

    def softmin(self, axis: int = -1) -> Self:
        """softmax(-x) along `axis`."""
        return (-self._as_float()).softmax(axis)

    def sinc(self) -> Self:
        """sin(pi x) / (pi x), 1 at 0."""
        x = self._as_float() * math.pi
        return (x == 0).where(x._const_like(1.0), x.sin() / x)
