"""The OpenCL tests run on whatever OpenCL devices are listed; on CI, pocl's CPU driver (`pip install
'atensor[opencl]'`, scripts/test.sh) with two devices. Without pyopencl or a platform they skip, saying why."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("POCL_DEVICES", "pthread pthread")  # before pocl starts: two devices, CL:0 and CL:1


def _why_not() -> str | None:
    try:
        import pyopencl  # noqa: F401
    except ImportError as exc:
        return f"pyopencl is not installed ({exc}); pip install 'atensor[opencl]' for pocl's CPU driver"
    from atensor.hcq import cl_runtime
    if not cl_runtime.listed_devices():
        return "no OpenCL platform is listed; pip install 'atensor[opencl]' or install a vendor's driver"
    try:
        cl_runtime.open_device(0)
    except cl_runtime.CLUnavailable as exc:  # a driver whose compiler cannot build for this machine
        return str(exc)
    return None


WHY_NOT = _why_not()


def pytest_collection_modifyitems(config, items):
    if WHY_NOT is None:
        return
    skip = pytest.mark.skip(reason=f"OpenCL tests skipped: {WHY_NOT}")
    for item in items:
        if "tests/opencl" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)


def two_devices() -> bool:
    """Whether CL:1 exists (pocl with POCL_DEVICES naming two devices, or a second GPU)."""
    from atensor.hcq import cl_runtime
    return WHY_NOT is None and len(cl_runtime.listed_devices()) >= 2
