"""backend/library.load_helper, the one way to compile and cache a standalone C helper (the MPI net
helper, the col2im window adds): compiled once per source, compiler, flags and CPU into cache_dir(),
loaded from there afterwards; clear errors without a compiler or when the source does not compile."""
from __future__ import annotations

import ctypes
import subprocess

import pytest

from atensor.backend.c import compiler, library

pytestmark = pytest.mark.skipif(compiler.path() is None, reason="needs a C compiler (cc, gcc or clang)")

SOURCE = "int atensor_test_twice(int x) { return 2 * x + %d; }\n"


def test_a_helper_is_compiled_once_into_the_cache_and_loaded_from_it(tmp_path, monkeypatch):
    monkeypatch.setenv("ATENSOR_CACHE", str(tmp_path))
    lib = library.load_helper("twice", SOURCE % 1)
    lib.atensor_test_twice.restype = ctypes.c_int
    assert lib.atensor_test_twice(20) == 41
    built = sorted(p.name for p in library.cache_dir().glob("twice-*.so"))
    assert len(built) == 1

    def no_compiler(*args: object) -> None:
        raise AssertionError("a cached helper must not be compiled again")
    monkeypatch.setattr(compiler, "compile_source", no_compiler)
    again = library.load_helper("twice", SOURCE % 1)
    again.atensor_test_twice.restype = ctypes.c_int
    assert again.atensor_test_twice(1) == 3
    assert sorted(p.name for p in library.cache_dir().glob("twice-*.so")) == built


def test_the_cache_key_covers_the_source_and_this_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("ATENSOR_CACHE", str(tmp_path))
    library.load_helper("twice", SOURCE % 1)
    library.load_helper("twice", SOURCE % 2)  # another source: another library
    assert len(list(library.cache_dir().glob("twice-*.so"))) == 2
    # -march=native code is only valid on this kind of CPU: another CPU's flags give another library
    monkeypatch.setattr(library, "cpu_key", lambda: "flags : another cpu")
    lib = library.load_helper("twice", SOURCE % 2)
    lib.atensor_test_twice.restype = ctypes.c_int
    assert lib.atensor_test_twice(0) == 2
    assert len(list(library.cache_dir().glob("twice-*.so"))) == 3


def test_no_compiler_or_a_compile_error_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("ATENSOR_CACHE", str(tmp_path))
    with pytest.raises(subprocess.SubprocessError):
        library.load_helper("broken", "this is not C;\n")
    monkeypatch.setattr(compiler, "path", lambda: None)
    with pytest.raises(RuntimeError, match="no C compiler"):
        library.load_helper("twice", SOURCE % 3)
