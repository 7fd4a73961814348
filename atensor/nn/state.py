"""State dicts and safetensors files, with tinygrad's names.

`get_state_dict(model)` finds every Tensor reachable through a model's attributes, lists, tuples and
dicts, keyed by dotted path ("layers.0.weight"), the same keys PyTorch gives the same module tree.
`load_state_dict` assigns into the model's tensors (lazily, like every assign; a sharded or
replicated model tensor gets the value laid out like itself). Files are written and read with the
maintained `safetensors` package's numpy API, so `safetensors.torch.load_file` opens them too.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Optional

import numpy as np

from atensor.profiler.collector import host_span
from atensor.porting import missing_name
from atensor.tensor.tensor import Tensor


def get_state_dict(obj: Any, prefix: str = "") -> dict[str, Tensor]:
    """Every tensor reachable from `obj`, keyed by its dotted attribute path.

    >>> from atensor import nn
    >>> sorted(get_state_dict(nn.Linear(2, 3)))
    ['bias', 'weight']
    """
    out: dict[str, Tensor] = {}
    _collect(obj, prefix, out, set())
    return out


def _collect(obj: Any, prefix: str, out: dict[str, Tensor], seen: set[int]) -> None:
    if isinstance(obj, Tensor):
        out[prefix.rstrip(".")] = obj
        return
    if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool, np.ndarray, type)):
        return
    seen.add(id(obj))
    if hasattr(obj, "_asdict"):
        items = obj._asdict().items()
    elif isinstance(obj, (dict, OrderedDict)):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    elif hasattr(obj, "__dict__"):
        items = vars(obj).items()
    else:
        return
    for key, value in items:
        _collect(value, f"{prefix}{key}.", out, seen)


def get_parameters(obj: Any) -> list[Tensor]:
    """The tensors of `get_state_dict(obj)`, each once (give them to an optimizer)."""
    unique: dict[int, Tensor] = {}
    for t in get_state_dict(obj).values():
        unique.setdefault(id(t), t)
    return list(unique.values())


def load_state_dict(model: Any, state_dict: dict[str, Tensor], strict: bool = True) -> list[Tensor]:
    """Assigns each tensor of `state_dict` into the model tensor of the same key (lazily; realize the
    returned tensors, or just use the model: the assigns run first). `strict` raises on a missing or
    unexpected key; shapes must always match."""
    model_state = get_state_dict(model)
    if strict:
        missing = sorted(set(model_state) - set(state_dict))
        unexpected = sorted(set(state_dict) - set(model_state))
        if missing or unexpected:
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
    loaded: list[Tensor] = []
    with host_span(f"load_state_dict ({len(state_dict)} tensors)", "load"):
        _assign_all(model_state, state_dict, loaded)
    return loaded


def _assign_all(model_state: dict[str, Tensor], state_dict: dict[str, Tensor], loaded: list[Tensor]) -> None:
    for key, target in model_state.items():
        if key not in state_dict:
            continue
        value = state_dict[key]
        if not isinstance(value, Tensor):
            value = Tensor(np.asarray(value))
        if tuple(value.shape) != tuple(target.shape):
            raise ValueError(f"load_state_dict: {key} has shape {value.shape}, "
                             f"the model's has {target.shape}")
        if isinstance(target.device, tuple):
            value = value.shard(target.device, target.shard_axis)
        elif value.device != target.device:
            value = value.to(target.device)
        loaded.append(target.assign(value.cast(target.dtype)))


def safe_save(tensors: dict[str, Tensor], path: str, metadata: Optional[dict[str, str]] = None) -> None:
    """Writes `tensors` to a safetensors file. Reads their values, so inside an event loop realize
    them first (`await Tensor.realize(*tensors.values())`); outside one they realize here."""
    from safetensors.numpy import save_file
    with host_span(f"save weights {path}", "load", detail=f"{len(tensors)} tensors"):
        arrays = {key: np.ascontiguousarray(t.numpy()) for key, t in tensors.items()}
        save_file(arrays, path, metadata=metadata)


def safe_load(path: str, device: Optional[str] = None) -> dict[str, Tensor]:
    """The tensors of a safetensors file (written by atensor, PyTorch or anyone), on `device`."""
    from safetensors.numpy import load_file
    with host_span(f"load weights {path}", "load"):
        return {key: Tensor(array, device=device) for key, array in load_file(path).items()}


def __getattr__(name: str) -> object:
    """tinygrad's names this module lacks raise an error naming docs/porting.md."""
    raise missing_name("atensor.nn.state", name)
