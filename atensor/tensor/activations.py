"""Activation functions with tinygrad's and PyTorch's names: relu, sigmoid, gelu, silu, softplus,
mish, elu, selu, the hard and leaky variants, and the rest.

All are compositions of elementwise ops (elementwise.py), so their gradients come from the ops' rules;
each clamps or splits where the direct formula would overflow.
"""
from __future__ import annotations

import math
from typing import Self


from atensor.dtype import least_upper_float


_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


class ActivationOps:
    """Activation methods of Tensor (a mixin)."""
    __slots__ = ()

    # ---- activations ---------------------------------------------------------------------------------
    def sigmoid(self) -> Self:
        """1 / (1 + e^-x), from t = e^-|x| (never overflows): 1 / (1 + t) for x >= 0, t / (1 + t) below,
        so the value and the gradient stay finite at any x."""
        x = self.cast(least_upper_float(self.dtype))
        positive = x >= 0
        t = positive.where(-x, x).exp()  # e^-|x|, with the gradient of the branch each side takes
        inv = (1 + t).reciprocal()
        return positive.where(inv, t * inv)

    def relu(self) -> Self:
        """x where positive, else 0; NaN stays NaN (PyTorch's and numpy's maximum; not tinygrad's, which
        gives 0); the gradient at 0 is 0 (PyTorch's and tinygrad's)."""
        return (self <= 0).where(0, self)

    def gelu(self, approximate: str = "tanh") -> Self:
        """GELU; tinygrad's tanh approximation by default, the exact erf form with approximate="none"."""
        x = self.cast(least_upper_float(self.dtype))
        if approximate == "none":
            return 0.5 * x * (1 + (x * (1 / math.sqrt(2))).erf())
        return 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())

    def silu(self) -> Self:
        """x * sigmoid(x)."""
        return self * self.sigmoid()

    swish = silu

    def softplus(self, beta: float = 1.0) -> Self:
        """log(1 + exp(beta * x)) / beta, computed without overflow."""
        bx = self.cast(least_upper_float(self.dtype)) * beta
        return (bx.relu() + ((-bx.abs()).exp() + 1).log()) * (1 / beta)

    def mish(self) -> Self:
        """x * tanh(softplus(x))."""
        return self * self.softplus().tanh()

    def hardtanh(self, min_val: float = -1.0, max_val: float = 1.0) -> Self:
        """Values clipped to [min_val, max_val]."""
        return self.clamp(min_val, max_val)

    def leaky_relu(self, neg_slope: float = 0.01) -> Self:
        """x where positive, else neg_slope * x."""
        return (self < 0).where(self * neg_slope, self)

    def elu(self, alpha: float = 1.0) -> Self:
        """x where positive, else alpha * (exp(x) - 1)."""
        x = self.cast(least_upper_float(self.dtype))
        return (x > 0).where(x, alpha * (x.exp() - 1))

    def relu6(self) -> Self:
        return self.clamp(0, 6)

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
