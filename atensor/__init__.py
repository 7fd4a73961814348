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
from atensor.jit.function import function
from atensor.graph.symbolic import Variable
from atensor.profiler.counters import GlobalCounters
from atensor.config import getenv
from atensor.porting import PortingError, MissingImportError, missing_name

__all__ = ["Tensor", "dtypes", "DType", "Device", "Context", "settings", "profile", "NotRealizedError",
           "jit", "Jit", "JitError", "JitWarning", "TinyJit", "Variable", "function", "GlobalCounters",
           "getenv", "PortingError", "MissingImportError"]


def __getattr__(name: str):
    """`atensor.nn`, `atensor.helpers` (and `atensor.models`) without importing the submodule first, as
    tinygrad's; tinygrad's names atensor lacks raise an error naming docs/porting.md."""
    if name in ("nn", "models", "helpers"):
        import importlib
        return importlib.import_module(f"atensor.{name}")
    raise missing_name("atensor", name)
__version__ = "0.1.0"
