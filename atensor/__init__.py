"""atensor: a lazy tensor library whose realize is awaitable.

    import trio
    from atensor import Tensor

    async def main():
        t = (Tensor.rand(1024, 1024) @ Tensor.rand(1024, 1024)).relu().sum(axis=1)
        await t.realize()          # the event loop stays free while the queues run
        print(t.numpy()[:4])
    trio.run(main)
"""
from atensor.config import Context, settings
from atensor.dtype import DType, dtypes
from atensor.hcq.device import Device
from atensor.profiler import profile
from atensor.tensor import NotRealizedError, Tensor
from atensor.jit import Jit, JitError, JitWarning, TinyJit, jit
from atensor.graph.symbolic import Variable

__all__ = ["Tensor", "dtypes", "DType", "Device", "Context", "settings", "profile", "NotRealizedError",
           "jit", "Jit", "JitError", "JitWarning", "TinyJit", "Variable"]


def __getattr__(name: str):
    """`atensor.nn` (and `atensor.models`) without importing the submodule first, as tinygrad's."""
    if name in ("nn", "models"):
        import importlib
        return importlib.import_module(f"atensor.{name}")
    raise AttributeError(f"module 'atensor' has no attribute {name!r}")
__version__ = "0.1.0"
