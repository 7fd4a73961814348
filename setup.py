"""Builds atensor's one compiled extension, the host path's core (atensor/core/ccore.c); the rest of the
build configuration is pyproject.toml's.

`optional=True`: on a machine without a C compiler (or without Python's headers) the install goes on
without the extension, setuptools says so in one line, and atensor runs its pure-Python core
(atensor/core/__init__.py prints a one-line notice at import). No build dependency beyond setuptools:
the extension is plain C against the CPython API.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("atensor.core._ccore", sources=["atensor/core/ccore.c"], optional=True)])
