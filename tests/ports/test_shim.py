"""tests/ports/tinygrad_shim.py on a stand-in for tinygrad's test_ops, written here: the file it loads sees
atensor under tinygrad's module names, and sys.modules is as it was afterwards (the real tinygrad, where
installed, stays importable). Runs without a tinygrad checkout; the real test_ops runs from one
(scripts/run_tinygrad_ops.sh)."""
from __future__ import annotations

import sys

import pytest

import atensor
from tests.ports.tinygrad_shim import SHIMMED, find_test_ops, load_test_ops

# the imports test_ops makes, and the questions it asks of tinygrad's backends
STAND_IN = '''
from tinygrad.helpers import getenv, DEBUG, DEV, IMAGE, Context
from tinygrad import Tensor, Device, dtypes
from tinygrad.tensor import _to_np_dtype
from tinygrad.renderer.nir import NIRRenderer

DEFAULT = Device.DEFAULT
SUPPORTED = Device[Device.DEFAULT].renderer.supported_dtypes()
IS_NIR = isinstance(Device[Device.DEFAULT].renderer, NIRRenderer)

def doubled(values):
    with Context(NOOPT=1):
        return (Tensor(values) * 2).numpy()
'''


def test_the_loaded_file_calls_atensor_and_sys_modules_is_put_back(tmp_path):
    (tmp_path / "test" / "backend").mkdir(parents=True)
    (tmp_path / "test" / "backend" / "test_ops.py").write_text(STAND_IN)
    before = {name: sys.modules.get(name) for name in SHIMMED}
    module = load_test_ops(find_test_ops(tmp_path), module_name="tests.ports._stand_in_test_ops")
    try:
        assert module.Tensor is atensor.Tensor and module.dtypes is atensor.dtypes
        assert module.DEFAULT == "CPU" and not module.IS_NIR and not module.IMAGE
        assert atensor.dtypes.float32 in module.SUPPORTED
        assert module._to_np_dtype(atensor.dtypes.int16).name == "int16"
        assert module.doubled([1.0, 2.5]).tolist() == [2.0, 5.0]
        assert {name: sys.modules.get(name) for name in SHIMMED} == before
    finally:
        sys.modules.pop("tests.ports._stand_in_test_ops", None)


def test_without_a_checkout_the_error_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.delenv("ATENSOR_TINYGRAD_DIR", raising=False)
    with pytest.raises(LookupError, match="run_tinygrad_ops.sh"):
        find_test_ops()
    with pytest.raises(LookupError, match="test/backend/test_ops.py"):
        find_test_ops(tmp_path)
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "test_ops.py").write_text("")  # an older checkout's place
    assert find_test_ops(tmp_path) == tmp_path / "test" / "test_ops.py"
