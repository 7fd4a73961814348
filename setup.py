"""Builds atensor's one compiled extension, the host path's core (atensor/core/*.c: ccore.c says why); the
rest of the build configuration is pyproject.toml's.

`optional=True`: on a machine without a C compiler (or without Python's headers) the install goes on
without the extension, setuptools says so in one line, and atensor runs its pure-Python core
(atensor/core/__init__.py prints a one-line notice at import). No build dependency beyond setuptools:
the extension is plain C against the CPython API.
"""
from setuptools import Extension, setup

CORE_FILES = ["ccore", "node", "walk", "ledger", "fresh", "cl"]  # the module, then the objects it holds

setup(ext_modules=[Extension("atensor.core._ccore", sources=[f"atensor/core/{name}.c" for name in CORE_FILES],
                             depends=["atensor/core/ccore.h"], libraries=["dl"], optional=True)])
