"""The `>>>` examples in atensor's docstrings run, and give what they show. Examples may use
`Tensor`, `atensor` and `np` without importing them (what a reader has at hand)."""
from __future__ import annotations

import doctest
import importlib
import pkgutil

import numpy as np
import pytest

import atensor


def _modules() -> list[str]:
    names = [atensor.__name__]
    for info in pkgutil.walk_packages(atensor.__path__, prefix="atensor."):
        names.append(info.name)
    return sorted(names)


def _with_examples() -> list[str]:
    found = []
    for name in _modules():
        module = importlib.import_module(name)
        if any(test.examples for test in doctest.DocTestFinder().find(module)):
            found.append(name)
    return found


def test_some_docstrings_have_examples():
    assert len(_with_examples()) >= 2  # the collection below is not silently empty


@pytest.mark.parametrize("name", _with_examples())
def test_docstring_examples(name: str):
    module = importlib.import_module(name)
    result = doctest.testmod(module, extraglobs={"Tensor": atensor.Tensor, "atensor": atensor, "np": np},
                             optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (see above)"
