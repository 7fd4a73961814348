"""docs/architecture.md's walks (and docs/design.md) match the code: every module they name exists, every
code name they quote is defined, each concept (a **bold** name) is defined in the module the walk gives
for it, and no walk needs more than MAX_CONCEPTS concepts, as many as its introduction says.

Why: the walks are how a newcomer learns the realize and the replay; after a move (backend/ into folders,
backend/c/native.py split by job) a stale path or name sends the reader to nothing. The check is read
from the source with `ast` (names defined: classes, functions, assignments, attributes set, fields,
parameters, enum members) and the text (C functions inside rendered sources), so it runs nothing.
"""
from __future__ import annotations

import ast
import pathlib
import re

import pytest

import atensor

ROOT = pathlib.Path(atensor.__file__).resolve().parent.parent
PACKAGE = ROOT / "atensor"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
DESIGN = ROOT / "docs" / "design.md"
MAX_CONCEPTS = 15  # issue 50: a walk a newcomer can hold in mind

# the walks: the sections whose steps are numbered, each step opening with its concept in bold
WALKS = {"eager": "## An eager realize", "jit": "## A jit replay"}
# a path the docs name: a package folder or module of atensor/ (or a repository folder)
PATH = re.compile(r"(?<![\w/.`-])((?:atensor/)?(?:[a-z_]+/)+(?:[a-z_]+\.py)?|[a-z_]+\.py)(?![\w/])")
QUOTED = re.compile(r"`([^`]+)`")
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z_0-9]*(?:\.[A-Za-z_][A-Za-z_0-9]*)*(?:\(\))?$")
CONCEPT = re.compile(r"\*\*([^*]+)\*\*(?: \(([^)`]+?)(?:\)| `))?")
# quoted words that are not atensor's names: Python's, the standard library's, an example's variables
NOT_OURS = {"contextvars", "x", "y", "fn", "step", "clWaitForEvents", "CL"}  # CL: a device's name
REPOSITORY_FOLDERS = {"docs/", "tests/", "bench/", "examples/", "scripts/"}


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def _defined() -> tuple[dict[str, set[str]], str]:
    """Per module path (relative to atensor/), the names it defines; and all source text (for C)."""
    names: dict[str, set[str]] = {}
    text = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        text.append(source)
        found: set[str] = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                found.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                found.add(node.attr)
            elif isinstance(node, ast.arg):
                found.add(node.arg)
            elif isinstance(node, ast.alias) and node.asname:
                found.add(node.asname)
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__"
                                                      for t in node.targets):
                found.update(c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)
                             and isinstance(c.value, str))
        names[str(path.relative_to(PACKAGE))] = found
    return names, "\n".join(text)


NAMES, SOURCE = _defined()
EVERY_NAME = set().union(*NAMES.values())


def _is_defined(name: str) -> bool:
    if name in EVERY_NAME:
        return True
    # a C function of a rendered source or helper (`at_replay`), or a settings field (config.py's table)
    return re.search(rf"\b{re.escape(name)}\s*\(", SOURCE) is not None or re.search(
        rf"^\| {re.escape(name)} \|", (PACKAGE / "config.py").read_text(), re.M) is not None


def _is_qualified(name: str) -> bool:
    """`name`'s parts are defined; `module.attr` (`programs.batch`) in a module of that name."""
    first, *rest = name.split(".")
    stems = [m for m in NAMES if pathlib.Path(m).stem == first]
    if rest and stems:
        return any(rest[0] in NAMES[m] for m in stems) and all(_is_defined(part) for part in rest)
    return all(_is_defined(part) for part in name.split("."))


def _exists(path: str) -> bool:
    if path in REPOSITORY_FOLDERS:
        return True
    inside = path.removeprefix("atensor/")
    return (PACKAGE / inside).exists() or (ROOT / path).exists()


@pytest.mark.parametrize("doc", [ARCHITECTURE, DESIGN], ids=["architecture", "design"])
def test_every_module_named_exists(doc):
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    missing = sorted({p for p in PATH.findall(text) if not _exists(p)})
    assert not missing, f"{doc.name} names modules that do not exist: {missing}"


def test_every_code_name_of_the_walks_is_defined():
    text = ARCHITECTURE.read_text()
    quoted = {q.removesuffix("()") for q in QUOTED.findall(text) if IDENTIFIER.match(q)}
    quoted -= NOT_OURS
    modules = {q for q in quoted if q.startswith("atensor.")}  # a module by its import name
    missing = sorted(q for q in modules if not _exists(q.replace(".", "/") + ".py") and not _exists(
        q.replace(".", "/") + "/") and not all(_is_defined(part) for part in q.split(".")[1:]))
    missing += sorted(q for q in quoted - modules if not _is_qualified(q))
    assert not missing, f"docs/architecture.md quotes names the code does not define: {missing}"


def _concepts(walk: str, steps: tuple[int, int] | None = None) -> list[tuple[str, str]]:
    """(concept, the module given for it, or "") of each bold name in the walk's numbered steps (only
    steps first..last when given)."""
    section = _section(ARCHITECTURE.read_text(), WALKS[walk])
    found = []
    for step in re.split(r"\n(?=\d+\. )", section)[1:]:
        number = int(step.split(".", 1)[0])
        if steps is None or steps[0] <= number <= steps[1]:
            found += [(m.group(1), (m.group(2) or "").strip()) for m in CONCEPT.finditer(step)]
    return found


def test_no_walk_needs_more_than_fifteen_concepts_and_the_introduction_says_how_many():
    """The jit replay goes through the realize's last steps (its introduction says which): a reader of
    it needs those concepts too, so they count towards its fifteen."""
    text = ARCHITECTURE.read_text()
    shared = re.search(r"\(steps (\d+)-(\d+) above\)", _section(text, WALKS["jit"]))
    assert shared, "the jit walk says which steps of the realize it goes through"
    first, last = int(shared.group(1)), int(shared.group(2))
    eager, jit, borrowed = len(_concepts("eager")), len(_concepts("jit")), len(_concepts("eager", (first, last)))
    assert eager <= MAX_CONCEPTS, f"an eager realize needs {eager} concepts: at most {MAX_CONCEPTS}"
    assert jit + borrowed <= MAX_CONCEPTS, f"a jit replay needs {jit} + {borrowed} concepts: at most {MAX_CONCEPTS}"
    intro = re.search(r"an eager realize\s+needs (\d+) of them, a jit replay (\d+) more and (\d+) of the\s+"
                      r"realize's \(its steps (\d+)-(\d+)\)", text)
    assert intro, "the introduction says how many concepts each walk needs"
    assert tuple(int(g) for g in intro.groups()) == (eager, jit, borrowed, first, last)


@pytest.mark.parametrize("walk", list(WALKS))
def test_each_concept_is_defined_in_the_module_the_walk_gives(walk):
    wrong = []
    for concept, owner in _concepts(walk):
        module = owner.split(" ")[0]
        if not IDENTIFIER.match(concept) or not module.endswith(".py"):
            continue  # a concept in words ("Program key"), or owned by a package ("Ledger (ledger/)")
        if concept not in NAMES.get(module.removeprefix("atensor/"), set()):
            wrong.append(f"{concept} is not defined in {module}")
    assert not wrong, wrong
