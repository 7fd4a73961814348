"""Tensor.scaled_dot_product_attention against torch.nn.functional.scaled_dot_product_attention."""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Tensor

torch = pytest.importorskip("torch")
rng = np.random.default_rng(0)
Q = rng.standard_normal((2, 6, 5, 8)).astype(np.float32)
K = rng.standard_normal((2, 3, 7, 8)).astype(np.float32)
V = rng.standard_normal((2, 3, 7, 4)).astype(np.float32)
MASK = rng.random((2, 1, 5, 7)) > 0.3
MASK[..., 0] = True


@pytest.mark.parametrize("kind", ["causal", "bool mask", "float mask", "no mask"])
def test_attention_matches_torch_with_grouped_query_heads(kind):
    kw = {"causal": dict(is_causal=True), "bool mask": dict(attn_mask=MASK),
          "float mask": dict(attn_mask=np.where(MASK, 0, -1e9).astype(np.float32)), "no mask": {}}[kind]
    ref = torch.nn.functional.scaled_dot_product_attention(
        torch.tensor(Q), torch.tensor(K), torch.tensor(V), enable_gqa=True,
        **{k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}).numpy()
    out = Tensor(Q).scaled_dot_product_attention(
        Tensor(K), Tensor(V), enable_gqa=True,
        **{k: Tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}).numpy()
    np.testing.assert_allclose(out, ref, atol=1e-5)


def test_attention_says_what_to_do_with_unequal_heads_or_dropout():
    with pytest.raises(ValueError, match="enable_gqa"):
        Tensor(Q).scaled_dot_product_attention(Tensor(K), Tensor(V))
    with pytest.raises(NotImplementedError, match="dropout"):
        Tensor(Q).scaled_dot_product_attention(Tensor(Q), Tensor(Q), dropout_p=0.1)
