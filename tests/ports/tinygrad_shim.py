"""Loads tinygrad's own op tests (test/backend/test_ops.py of a tinygrad checkout) with `tinygrad` meaning
atensor: the check that atensor's Tensor API ports with import changes only, run from outside the repo.

Why a shim and not a port: the file is tinygrad's test of its Tensor API against PyTorch, 400-odd cases that
nobody here wrote, so it is never copied into this repository. A user points ATENSOR_TINYGRAD_DIR at a
tinygrad checkout (scripts/run_tinygrad_ops.sh does), and tests/ports/test_tinygrad_ops.py runs that file's
cases against atensor; what differs is listed in tinygrad_known_failures.py, each with its reason, and tested
in our own words in tests/tensor/test_tinygrad_differences.py.

How: `load_test_ops(path)` executes the file as a module while `sys.modules` maps `tinygrad`,
`tinygrad.helpers`, `tinygrad.tensor`, `tinygrad.renderer` and `tinygrad.renderer.nir` to modules made here
from atensor's objects, then puts back what was there before. The file binds its names at import (it imports
nothing inside its tests), so from then on its tests call atensor; the real tinygrad package stays importable
for every other test. Invariant: after `load_test_ops()` returns, `sys.modules` holds exactly the tinygrad
entries it held before.

What the shim supplies that is not atensor's API: the names test_ops uses to ask which of tinygrad's backends
it runs on (`DEV`, `IMAGE`, `NIRRenderer`, `Device[...].renderer`), answered as "no image dtype, not the NIR
renderer, every dtype supported" (atensor runs every dtype on every device: a kernel the OpenCL renderer does
not lower runs on the host as a command of the CL queue); and `Context(NOOPT=1)`, a tinygrad kernel-optimizer
switch atensor has nothing to turn off, taken as no change. Everything else (Tensor, dtypes, getenv, Context's
settings, the device name) is atensor's own.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import pathlib
import sys
import types
from dataclasses import dataclass
from typing import Iterator

import atensor
from atensor import Tensor, dtypes
from atensor.dtype import DType
from atensor.helpers import getenv

# where tinygrad keeps test_ops in a checkout: test/backend/ now (2026), test/ before
TEST_OPS_PATHS = ("test/backend/test_ops.py", "test/test_ops.py")
# the names load_test_ops() swaps in sys.modules while test_ops imports
SHIMMED = ("tinygrad", "tinygrad.helpers", "tinygrad.tensor", "tinygrad.renderer", "tinygrad.renderer.nir")
# tinygrad Context flags about its kernel optimizer: atensor has none, so they change nothing here
NO_OP_FLAGS = frozenset({"NOOPT"})


@dataclass(frozen=True)
class Dev:
    """tinygrad's `DEV` (the chosen backend): `device` is atensor's default device kind; atensor has one
    renderer per device and no mock interfaces, so `renderer` and `interface` are empty."""
    device: str
    renderer: str = ""
    interface: str = ""


class NIRRenderer:
    """tinygrad's NIR renderer class; atensor's devices never have it (test_ops asks `isinstance`)."""


class _Renderer:
    """What `Device[name].renderer` answers in test_ops: the dtypes the device computes in."""

    @staticmethod
    def supported_dtypes() -> list[DType]:
        return [dt for dt in vars(dtypes).values() if isinstance(dt, DType)]


class _DeviceMeta(type):
    @property
    def DEFAULT(cls) -> str:  # noqa: N802 - tinygrad's name
        """atensor's default device kind ("CPU", "CL"), read now: `Context(default_device=...)` changes it."""
        return str(atensor.settings.default_device).split(":")[0]

    def __getitem__(cls, name: str) -> types.SimpleNamespace:
        atensor.Device.get(name if ":" in name else f"{name}:0")  # an unknown device fails as in atensor
        return types.SimpleNamespace(renderer=_Renderer())


class Device(metaclass=_DeviceMeta):
    """tinygrad's `Device` as test_ops reads it: `Device.DEFAULT` and `Device[name].renderer`."""


@contextlib.contextmanager
def Context(**flags: object) -> Iterator[object]:
    """atensor's Context, taking also tinygrad's optimizer flags in NO_OP_FLAGS (they change nothing)."""
    with atensor.Context(**{k: v for k, v in flags.items() if k not in NO_OP_FLAGS}) as inside:
        yield inside


def _to_np_dtype(dt: DType | None):
    """tinygrad.tensor._to_np_dtype: the numpy dtype of a DType (None stays None)."""
    return None if dt is None else dt.np


def _module(name: str, **names: object) -> types.ModuleType:
    module = types.ModuleType(name, f"tests/ports/tinygrad_shim.py: tinygrad's {name} as atensor")
    module.__dict__.update(names)
    return module


def shim_modules() -> dict[str, types.ModuleType]:
    """The modules tinygrad's test_ops imports, made of atensor's objects."""
    helpers = _module("tinygrad.helpers", getenv=getenv, DEBUG=int(atensor.settings.debug), IMAGE=0,
                      DEV=Dev(Device.DEFAULT), Context=Context)
    nir = _module("tinygrad.renderer.nir", NIRRenderer=NIRRenderer)
    renderer = _module("tinygrad.renderer", nir=nir)
    tensor = _module("tinygrad.tensor", Tensor=Tensor, _to_np_dtype=_to_np_dtype)
    root = _module("tinygrad", Tensor=Tensor, Device=Device, dtypes=dtypes, Context=Context,
                   helpers=helpers, tensor=tensor, renderer=renderer)
    root.__path__ = []  # a package, so `import tinygrad.x` looks up sys.modules
    renderer.__path__ = []
    return {"tinygrad": root, "tinygrad.helpers": helpers, "tinygrad.tensor": tensor,
            "tinygrad.renderer": renderer, "tinygrad.renderer.nir": nir}


def find_test_ops(tinygrad_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """test_ops.py of the tinygrad checkout at `tinygrad_dir` (default: $ATENSOR_TINYGRAD_DIR). Raises
    LookupError saying what to do when none is given or the checkout has no test_ops."""
    where = tinygrad_dir if tinygrad_dir is not None else os.environ.get("ATENSOR_TINYGRAD_DIR")
    if not where:
        raise LookupError("tinygrad's test_ops runs from a tinygrad checkout: git clone "
                          "https://github.com/tinygrad/tinygrad, then scripts/run_tinygrad_ops.sh TINYGRAD_DIR "
                          "(or set ATENSOR_TINYGRAD_DIR)")
    for relative in TEST_OPS_PATHS:
        path = pathlib.Path(where) / relative
        if path.is_file():
            return path
    raise LookupError(f"{where} has none of {', '.join(TEST_OPS_PATHS)}: give the root of a tinygrad checkout")


def load_test_ops(path: str | os.PathLike | None = None,
                  module_name: str = "tests.ports.tinygrad_upstream_test_ops") -> types.ModuleType:
    """tinygrad's test_ops module (`path`, default find_test_ops()), imported with `tinygrad` meaning atensor
    (once per process and module name)."""
    if module_name in sys.modules:
        return sys.modules[module_name]
    source = pathlib.Path(path) if path is not None else find_test_ops()
    saved = {name: sys.modules[name] for name in SHIMMED if name in sys.modules}
    spec = importlib.util.spec_from_file_location(module_name, source)
    assert spec is not None and spec.loader is not None, f"cannot load {source}"
    module = importlib.util.module_from_spec(spec)
    sys.modules.update(shim_modules())
    try:
        spec.loader.exec_module(module)
    finally:
        for name in SHIMMED:
            sys.modules.pop(name, None)
        sys.modules.update(saved)
    sys.modules[module_name] = module
    return module
