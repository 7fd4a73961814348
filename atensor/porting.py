"""tinygrad names that atensor does not have, each with what to write instead (docs/porting.md).

A program ported from tinygrad by changing its imports meets these first. Instead of a bare
AttributeError or ImportError it gets `PortingError` (`Tensor.X`) or `MissingImportError` (`from atensor
import X`) naming the page and, in one line, the atensor form. The table is the page's source of truth:
tests/tensor/test_tinygrad_names.py checks that every entry is on docs/porting.md and that each name is
indeed missing (a name that lands in atensor must leave the table).

This module imports nothing: the Tensor, the package root, `helpers` and `nn` all ask it.
"""
from __future__ import annotations

PAGE = "docs/porting.md"

# "where.name" -> the atensor form (or why there is none). `where` is Tensor, atensor, atensor.helpers,
# atensor.nn, atensor.nn.optim or atensor.nn.state, as the program spells the import after the port.
MISSING: dict[str, str] = {
    # -- Tensor methods -------------------------------------------------------------------------------------
    "Tensor.uop": "no UOp graph: `t.node` is atensor's graph node (atensor/graph/node.py)",
    "Tensor.alu": "call the op's method (`t.exp2()`, `a.maximum(b)`); no raw ALU entry",
    "Tensor.const_like": "`t.full_like(value)`",
    "Tensor.const": "`Tensor.full(shape, value)`",
    "Tensor.size": "`t.shape[dim]` or `t.numel()`",
    "Tensor.short": "`t.cast(dtypes.int16)`",
    "Tensor.bfloat16": "`t.cast(dtypes.bfloat16)`",
    "Tensor.is_floating_point": "`dtypes.is_float(t.dtype)`",
    "Tensor.allclose": "`np.allclose(a.numpy(), b.numpy())`",
    "Tensor.bitwise_and": "`a & b`", "Tensor.bitwise_or": "`a | b`", "Tensor.bitwise_xor": "`a ^ b`",
    "Tensor.linear": "`x @ weight.T + bias` (or `nn.Linear`)",
    "Tensor.pad_to": "`t.pad(...)` with the widths computed from the target shape",
    "Tensor.shrink_to": "`t.shrink(...)` with the ranges computed from the target shape",
    "Tensor.rearrange": "`reshape` and `permute` (no einops patterns)",
    "Tensor.multinomial": "`(t.cumsum(-1) > Tensor.rand(...)).argmax(-1)` (no multinomial op yet)",
    "Tensor.randperm": "`Tensor.rand(n).argsort()` (or a numpy permutation passed in)",
    "Tensor.random_bits": "`Tensor.rand` / `Tensor.randint` (counter-based generator, atensor/tensor/rng.py)",
    "Tensor.threefry": "`Tensor.rand` / `Tensor.randint`: atensor's generator is counter based too, not exposed raw",
    "Tensor.newton_schulz": "`atensor.nn.optim.newton_schulz(t, steps, coefficients)` (used by `nn.optim.Muon`)",
    "Tensor.qr": "not in atensor: compute on numpy (`np.linalg.qr(t.numpy())`)",
    "Tensor.svd": "not in atensor: compute on numpy (`np.linalg.svd(t.numpy())`)",
    "Tensor.keccak": "not in atensor: hash on the host (`hashlib.sha3_256(t.numpy().tobytes())`)",
    "Tensor.hash": "not in atensor: hash on the host",
    "Tensor.from_url": "no downloads at run time: fetch the file yourself, then `Tensor(np.load(...))`",
    "Tensor.from_blob": "`Tensor(np.ctypeslib.as_array(ptr, shape))` (copies)",
    "Tensor.shard_like": "`t.shard(other.device, axis)`",
    "Tensor.to_": "`t.assign(t.to(device))` (or keep the returned `t.to(device)`)",
    "Tensor.replace": "`t.assign(other)`",
    "Tensor.is_param": "`t.requires_grad`", "Tensor.is_param_": "`t.requires_grad_(flag)`",
    "Tensor.as_param": "`t.requires_grad_(True)`",
    "Tensor.image_conv2d": "`t.conv2d(...)` (no image dtype)", "Tensor.image_dot": "`t.dot(...)` (no image dtype)",
    "Tensor.custom_kernel": "not in atensor: compose ops, or add a kernel in atensor/backend/",
    "Tensor.call": "`atensor.function` (a pass-through: the schedule cache reuses equal sub-graphs)",
    "Tensor.callify": "`atensor.function`",
    "Tensor.invalids": "`Tensor.empty(shape)`",
    "Tensor.linear_with_vars": "`Tensor.realize()`: atensor schedules into a TaskGraph (sched/), not a linear list",
    "Tensor.schedule_linear": "`Tensor.realize()`", "Tensor.decode_hevc_frame": "not in atensor",
    "Tensor.max_numel": "`t.numel()`", "Tensor.max_shape": "`t.shape`",
    "Tensor.usum": "`t.sum()`", "Tensor.uprod": "`t.prod()`", "Tensor.ufix": "`Tensor(x)`",
    # -- `from atensor import X` --------------------------------------------------------------------------------
    "atensor.UOp": "no UOp: `atensor.graph.node.Node` is atensor's graph node; `Variable` is at the top level",
    "atensor.fetch": "no downloads at run time: fetch the file yourself (pip packages ship the test data here)",
    # -- helpers --------------------------------------------------------------------------------------------------
    "atensor.helpers.GlobalCounters": "`from atensor import GlobalCounters`",
    "atensor.helpers.Context": "`from atensor import Context`",
    "atensor.helpers.DEBUG": "`atensor.settings.debug` (ATENSOR_DEBUG, or `Context(DEBUG=2)`)",
    "atensor.helpers.Timing": "`with atensor.profile() as prof: ...; print(prof.summary())`, or time.perf_counter",
    "atensor.helpers.Profiling": "`atensor.profile()` (python -m cProfile for Python time)",
    "atensor.helpers.prod": "`math.prod`", "atensor.helpers.flatten": "`[x for xs in xss for x in xs]`",
    "atensor.helpers.dedup": "`list(dict.fromkeys(xs))`", "atensor.helpers.all_int": "`all(isinstance(x, int) ...)`",
    "atensor.helpers.ceildiv": "`-(-a // b)`", "atensor.helpers.round_up": "`-(-a // b) * b`",
    "atensor.helpers.make_tuple": "`(x,) * n if isinstance(x, int) else tuple(x)`",
    "atensor.helpers.argfix": "pass the shape as separate ints or one tuple (both taken)",
    "atensor.helpers.partition": "two list comprehensions", "atensor.helpers.unwrap": "`assert x is not None`",
    "atensor.helpers.fetch": "no downloads at run time: fetch the file yourself",
    "atensor.helpers.CI": "`os.environ.get('CI')`", "atensor.helpers.OSX": "`sys.platform == 'darwin'`",
    "atensor.helpers.TRAINING": "`Tensor.training` (set by `Context(TRAINING=1)` or `Tensor.train()`)",
    "atensor.helpers.BEAM": "no kernel search: atensor's kernels are numpy/BLAS or compiled C (ATENSOR_NATIVE)",
    "atensor.helpers.JIT": "no global switch: call the function undecorated to run it without `atensor.jit`",
    # -- nn -------------------------------------------------------------------------------------------------------
    "atensor.nn.Conv1d": "`nn.Conv2d` on `x.unsqueeze(-2)` with a (1, k) kernel, then `squeeze(-2)`",
    "atensor.nn.ConvTranspose1d": "`Tensor.conv_transpose2d` on an unsqueezed axis",
    "atensor.nn.ConvTranspose2d": "`x.conv_transpose2d(weight, bias, ...)` with your own weight",
    "atensor.nn.GroupNorm": "reshape to (n, groups, -1) and normalize with `mean` / `var` (or `layernorm`)",
    "atensor.nn.InstanceNorm": "normalize over the spatial axes with `mean` / `var`",
    "atensor.nn.LayerNorm2d": "`nn.LayerNorm(channels)` on `x.permute(0, 2, 3, 1)`, permuted back",
    "atensor.nn.BatchNorm3d": "`nn.BatchNorm(channels)`: it normalizes over every axis but 1, any rank",
    "atensor.nn.LSTMCell": "not in atensor: write the gates with `Linear`, `sigmoid` and `tanh`",
    "atensor.nn.optim.LARS": "`nn.optim.SGD` (no trust ratio); `nn.optim.Muon` for the Newton-Schulz form",
    "atensor.nn.optim.OptimizerGroup": "one optimizer per group, and `Tensor.realize(*a.schedule_step(), *b.schedule_step())`",
    "atensor.nn.state.torch_load": "`torch.load` then `Tensor(array.numpy())`, or save as safetensors and `safe_load`",
    "atensor.nn.state.tar_extract": "`tarfile` from the standard library",
    "atensor.nn.state.zip_extract": "`zipfile` from the standard library",
    "atensor.nn.state.safe_load_metadata": "`safetensors.safe_open(path, 'np').metadata()`",
    "atensor.nn.datasets.cifar": "no downloads at run time and no CIFAR package here: load the arrays yourself",
}


class PortingError(AttributeError):
    """A tinygrad attribute atensor does not have (an AttributeError, so `hasattr` stays False)."""


class MissingImportError(ImportError):
    """`from atensor... import X` of a tinygrad name atensor does not have. Not an AttributeError: Python
    would replace one by its bare `cannot import name` and lose the pointer to the porting page."""


def _message(where: str, name: str) -> str:
    form = MISSING.get(f"{where}.{name}")
    if form is None:
        return f"{where} has no {name!r}"
    return (f"{where}.{name} is tinygrad's and not atensor's; instead: {form}. "
            f"Every difference is listed in {PAGE}")


def missing_attribute(where: str, name: str) -> AttributeError:
    """The error for `obj.name` (`where` is "Tensor"): a PortingError for tinygrad's names, else a plain
    AttributeError with Python's usual wording."""
    if f"{where}.{name}" in MISSING:
        return PortingError(_message(where, name))
    return AttributeError(f"{where!r} object has no attribute {name!r}")


def missing_name(module: str, name: str) -> Exception:
    """The error for a module's `__getattr__`: a MissingImportError for tinygrad's names (so `from module
    import name` says where to look), else AttributeError as Python's own."""
    if f"{module}.{name}" in MISSING:
        return MissingImportError(_message(module, name), name=name)
    return AttributeError(f"module {module!r} has no attribute {name!r}")
