"""`CL` and `CL:N` devices: their names, their errors (what is missing, what to install or set), and
values going in and out of them."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from atensor import Tensor
from atensor.hcq import cl_runtime
from atensor.hcq.device import Device, DeviceError, canonical
from atensor.hcq.cl_queue import CLQueue


def test_cl_is_cl0_and_its_queues_are_opencl_queues():
    assert canonical("CL") == "CL:0" and canonical("cl:1") == "CL:1"
    dev = Device.get("CL")
    assert dev.name == "CL:0" and dev.cl is not None
    assert isinstance(dev.compute, CLQueue) and isinstance(dev.copy, CLQueue)
    assert dev.compute.cl is not dev.copy.cl  # two in-order OpenCL queues
    assert type(Device.get("CPU").compute) is not CLQueue  # CPU devices are as they were


def test_a_device_number_opencl_does_not_list_names_the_device_and_the_devices_there_are():
    count = len(cl_runtime.listed_devices())
    with pytest.raises(DeviceError, match=rf"CL:{count + 1} does not exist: OpenCL lists {count} device") as info:
        Device.get(f"CL:{count + 1}")
    assert "POCL_DEVICES" in str(info.value)


def test_without_pyopencl_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyopencl", None)  # import pyopencl raises ImportError
    monkeypatch.setattr(cl_runtime, "_opened", {})
    with pytest.raises(DeviceError, match=r"needs pyopencl.*pip install 'atensor\[opencl\]'"):
        Device.get("CL:7")


def test_without_a_platform_the_error_says_what_to_install_or_set(monkeypatch):
    monkeypatch.setattr(cl_runtime, "listed_devices", lambda: [])
    monkeypatch.setattr(cl_runtime, "_opened", {})
    with pytest.raises(DeviceError, match=r"CL:6: no OpenCL platform .*atensor\[opencl\].*OCL_ICD_VENDORS"):
        Device.get("CL:6")


def test_a_device_whose_compiler_does_not_know_the_cpu_is_refused_saying_why():
    """pocl 3.0's LLVM names a CPU newer than itself 'generic' and then builds no kernel: opening such a
    device builds a trial kernel and refuses the device with the compiler's reason; any other device
    builds nothing at open."""
    built = []

    class FakeCL:
        class Error(Exception):
            pass

        class Program:
            def __init__(self, context, source):
                built.append(source)

            def build(self, devices):
                raise FakeCL.Error("clBuildProgram failed: BUILD_PROGRAM_FAILURE\n\nerror: unknown target CPU 'generic'\n")

    class FakeDevice:
        name = "pthread-AMD EPYC"
        version = "OpenCL 3.0 PoCL HSTR: pthread-x86_64-unknown-linux-gnu-generic"
    with pytest.raises(cl_runtime.CLUnavailable, match=r"CL:3 .*cannot build kernels: error: unknown target "
                                                       r"CPU 'generic'.*newer LLVM"):
        cl_runtime._check_compiler(FakeCL, None, FakeDevice(), 3)
    assert len(built) == 1
    FakeDevice.version = "OpenCL 3.0 PoCL HSTR: pthread-x86_64-unknown-linux-gnu-znver4"
    cl_runtime._check_compiler(FakeCL, None, FakeDevice(), 3)
    assert len(built) == 1  # a CPU the driver names: no trial build


def test_values_go_to_cl_and_back_through_tensor_and_to():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = Tensor(a, device="CL")
    assert t.device == "CL:0"
    np.testing.assert_array_equal(t.numpy(), a)
    np.testing.assert_array_equal(Tensor(a).to("CL").to("CPU").numpy(), a)
    np.testing.assert_array_equal(t[1, :, 2:].numpy(), a[1, :, 2:])
    assert Tensor([1, 2, 3], device="CL").tolist() == [1, 2, 3]
    assert Tensor.zeros(3, 2, device="CL").sum().item() == 0.0


def test_a_packed_llm_on_cl_is_refused_saying_to_load_it_as_float32():
    pytest.importorskip("gguf")
    from atensor.models.gguf import ModelFileMissing, load_gguf
    from atensor.models.llama import Llama
    try:
        gguf = load_gguf()
    except ModelFileMissing as missing:
        pytest.skip(str(missing))
    with pytest.raises(ValueError, match="weights='float32'"):
        Llama(gguf, slots=1, context=16, device="CL")
