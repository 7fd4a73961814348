"""bench/llama_peer.py's build of llama.cpp for the running CPU: CMake flags from /proc/cpuinfo's flags,
AMX off under a hypervisor, pip without its cache (a wheel built on another CPU is not this CPU's)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.llama_peer import cmake_flags, pip_command  # noqa: E402

AVX512 = {"avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}
ZEN4 = frozenset(AVX512 | {"avx512_vnni", "avx512_bf16", "avx512vbmi", "hypervisor"})
SAPPHIRE_RAPIDS = frozenset(AVX512 | {"avx512_vnni", "avx512_bf16", "avx512vbmi", "avx_vnni", "amx_tile", "amx_int8",
                                      "amx_bf16"})


def _on(flags: list[str]) -> set[str]:
    return {f[2:-3] for f in flags if f.endswith("=ON")}


def test_a_zen4_guest_gets_avx512_vnni_bf16_vbmi_and_neither_avx_vnni_nor_amx():
    flags = cmake_flags(ZEN4)
    assert _on(flags) == {"GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_AVX512", "GGML_AVX512_VNNI",
                          "GGML_AVX512_BF16", "GGML_AVX512_VBMI"}
    assert "-DGGML_NATIVE=OFF" in flags and "-DGGML_AMX_TILE=OFF" in flags


def test_amx_is_built_on_bare_metal_and_left_out_under_a_hypervisor():
    assert {"GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16", "GGML_AVX_VNNI"} <= _on(cmake_flags(SAPPHIRE_RAPIDS))
    guest = _on(cmake_flags(SAPPHIRE_RAPIDS | {"hypervisor"}))
    assert "GGML_AVX_VNNI" in guest and not {"GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"} & guest


def test_a_cpu_without_x86_vectors_gets_none_and_avx512_needs_all_its_parts():
    assert _on(cmake_flags(frozenset({"fp", "asimd", "neon"}))) == set()
    assert "GGML_AVX512" not in _on(cmake_flags(ZEN4 - {"avx512cd"}))


def test_the_pip_command_builds_from_source_without_pips_cache():
    command, env = pip_command(ZEN4, python="python3")
    assert command[:4] == ["python3", "-m", "pip", "install"]
    assert "--no-cache-dir" in command and "--no-binary" in command
    assert env["CMAKE_ARGS"] == " ".join(cmake_flags(ZEN4))
