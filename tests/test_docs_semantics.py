"""Runs every `python` block of docs/semantics.md, each in a fresh namespace, so the page that states
atensor's semantics cannot drift from what the code does."""
from __future__ import annotations

import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "semantics.md"
BLOCK = re.compile(r"^## (?P<title>[^\n]+)|^```python\n(?P<code>.*?)^```", re.M | re.S)


def _blocks() -> list[tuple[str, str]]:
    found, title, count = [], "intro", 0
    for match in BLOCK.finditer(DOC.read_text()):
        if match.group("title"):
            title, count = match.group("title"), 0
            continue
        count += 1
        found.append((f"{title} #{count}", match.group("code")))
    return found


BLOCKS = _blocks()


def test_every_rule_has_an_example():
    titles = re.findall(r"^## (.+)$", DOC.read_text(), re.M)
    with_code = {name.rsplit(" #", 1)[0] for name, _ in BLOCKS}
    assert titles and set(titles) == with_code


@pytest.mark.parametrize("code", [c for _, c in BLOCKS], ids=[n for n, _ in BLOCKS])
def test_doc_example_runs(code):
    if "bfloat16" in code:
        pytest.importorskip("ml_dtypes", reason="bfloat16 needs ml_dtypes")
    exec(compile(code, str(DOC), "exec"), {"__name__": "docs_semantics"})
