"""The cases of tinygrad's test_ops that atensor fails, each with why, and the subset the default suite runs.

Keys are "Class::test_name" of tinygrad's test/backend/test_ops.py (run from a tinygrad checkout through
tests/ports/tinygrad_shim.py). CPU lists the failures on atensor's CPU device; CL_ONLY those that fail on
OpenCL only (the CL run expects CPU's and CL_ONLY's). Each reason says which side differs, and
tests/tensor/test_tinygrad_differences.py tests atensor's side of each; a listed case that passes shows as
XPASS: then delete its line.
"""
from __future__ import annotations

_GRAD_RULE = ("backward() fills .grad of tensors with requires_grad=True only (PyTorch's rule); tinygrad 0.14 "
              "fills every floating tensor the loss reads, and this test never sets requires_grad")
_DTYPE_ERROR = ("an unknown dtype name raises TypeError naming the dtypes (atensor/dtype.py); tinygrad raises "
                "AttributeError from getattr(dtypes, '')")

CPU: dict[str, str] = {
    "TestOps::test_cmp_lt_backwards": _GRAD_RULE,
    "TestOps::test_cmp_ne_backwards": _GRAD_RULE,
    "TestOps::test_sum_dtype_arg": _DTYPE_ERROR,
    "TestOps::test_prod_dtype_arg": _DTYPE_ERROR,
    "TestOps::test_one_hot": "one_hot(num_classes=-1) infers the count from the data, as PyTorch does; tinygrad "
                             "now refuses -1 with ValueError",
    "TestOps::test_scatter_no_reduce_tensor_src": "scatter(reduce='add') takes a tensor src, as PyTorch does; "
                                                  "tinygrad refuses it with TypeError",
    "TestOps::test_slice_fancy_indexing_dim_collapse_int": "an int beside tensor indices counts as an advanced "
        "index (numpy's rule, docs/semantics.md section 8), so x[1,:,s,t] puts the index axes first; PyTorch "
        "and tinygrad apply the int as a basic index and keep them in place",
    "TestOps::test_sigmoid_alt_extreme": "the gradient of exp(x)/(1+exp(x)) at x=300 is inf/inf = nan in "
        "float32 (exp overflows); tinygrad's rewrite of the quotient gives 0",
    "TestOpsUint8::test_interpolate_bilinear": "uint8 bilinear downscaling (64 -> 10) is off by one in about 13% "
        "of pixels: PyTorch's separable uint8 kernel rounds fixed-point weights; atensor lerps in float and "
        "rounds after each axis (exact for the upscales tried)",
}

CL_ONLY: dict[str, str] = {}  # (test_avg_pool3d's deep kernel recursed past the limit in the C renderer: fixed)

# What the default suite runs (ATENSOR_TINYGRAD_OPS=all runs every case): a case or two per kind of op,
# forward and backward, the quick ones (about 20 s on this 2-core machine).
SUBSET: frozenset[str] = frozenset("TestOps::" + name for name in """
    test_full test_zeros test_eye test_arange
    test_add test_sub test_mul test_div test_pow test_sqrt test_exp test_log test_sin test_relu test_gelu
    test_sigmoid test_tanh test_abs test_floor test_trunc test_clip test_erf test_mish test_lerp
    test_cmp_eq test_where test_maximum test_masked_fill test_cast test_bitcast test_int_or
    test_sum test_max test_min test_mean test_var test_std test_prod test_argmax test_cumsum test_logsumexp
    test_softmax test_log_softmax test_sum_dtype_arg test_one_hot
    test_matmul test_matmul_batched test_gemm test_dot
    test_simple_conv2d test_strided_conv2d_simple test_simple_conv_transpose2d test_max_pool2d_simple
    test_avg_pool2d_ceil_mode_output_size_reduce_by_one
    test_reshape test_permute test_expand test_pad test_pad_reflect_mode test_flip test_cat test_stack
    test_split test_repeat test_unfold test_roll
    test_slice_int_indexing test_slice_fancy_indexing_with_tensors test_gather test_scatter
    test_nll_loss test_cross_entropy_class_indices test_normalize test_scaled_dot_product_attention_gqa_errors
""".split())


def expected_failures(device: str) -> dict[str, str]:
    """The known failures of a run on `device` ("CPU", "CL"), with their reasons."""
    return {**CPU, **CL_ONLY} if device == "CL" else dict(CPU)
