"""One module hands command lists to queues: engine/plan.py. Every device's queue takes them through one
interface (hcq/queue.py's `Queue`: `reserve`, `submit`, `run_here`, `start_here`), and what a device can do
with a list (an OpenCL queue takes a command that enqueues a whole sequence of launches) is a property
of that interface, not a second entry.

Read from the source with `ast`, as tests/test_layering.py reads imports, so a second submitter fails
here before anyone runs it:
- outside hcq/ (where the queues keep their own), only engine/plan.py calls a queue's `reserve`,
  `run_here`, `start_here`, or `submit` on a receiver that names a queue (`queue.submit`,
  `L.queues[0].submit`); other objects' `submit` (the dispatcher's and the batcher's take jobs, a
  plan's and a program's are the plan's own entry) are not a queue's;
- no class in hcq/ defines a second public submitting method: a method named `submit...` other than
  `submit`, or `enqueue...`.
"""
from __future__ import annotations

import ast
import pathlib

import atensor

PACKAGE_DIR = pathlib.Path(atensor.__file__).parent
SUBMITTER = "engine/plan.py"
# a queue's own entries: only the submitter calls them (a receiver of any name for these three)
QUEUE_ONLY = {"reserve", "run_here", "start_here"}


def _relative(path: pathlib.Path) -> str:
    return path.relative_to(PACKAGE_DIR).as_posix()


def _submitting_calls(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, call) of each call in `tree` that hands commands to a queue or reserves its values."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name, receiver = node.func.attr, ast.unparse(node.func.value)
        if name in QUEUE_ONLY or name.startswith("submit_") or \
                (name == "submit" and "queue" in receiver.lower()):
            found.append((node.lineno, f"{receiver}.{name}(...)"))
    return found


def _outside_hcq() -> list[pathlib.Path]:
    return [p for p in sorted(PACKAGE_DIR.rglob("*.py")) if not _relative(p).startswith("hcq/")]


def test_only_engine_plan_hands_commands_to_queues():
    others = []
    for path in _outside_hcq():
        if _relative(path) == SUBMITTER:
            continue
        for line, call in _submitting_calls(ast.parse(path.read_text(), filename=str(path))):
            others.append(f"{_relative(path)}:{line}: {call}")
    assert not others, ("only engine/plan.py hands command lists to queues (Plan.submit); make these a "
                        "fast case the plan submits:\n  " + "\n  ".join(others))


def test_the_submitter_does_submit():
    path = PACKAGE_DIR / SUBMITTER
    calls = _submitting_calls(ast.parse(path.read_text()))
    names = {call.split("(")[0].rsplit(".", 1)[1] for _, call in calls}
    assert {"reserve", "submit", "run_here", "start_here"} <= names, names  # the check above reads real calls


def test_no_queue_class_has_a_second_submitting_method():
    extra = []
    for path in sorted((PACKAGE_DIR / "hcq").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name != "submit" and \
                        item.name.startswith(("submit", "enqueue")):  # a public entry (helpers are `_`)
                    extra.append(f"hcq/{path.name}: {node.name}.{item.name}")
    assert not extra, ("a queue takes command lists through Queue.submit only; a device's way of running a "
                       "list is a property of its commands' runners:\n  " + "\n  ".join(extra))


def test_the_checks_name_a_second_submitter():
    tree = ast.parse("def f(q, lean, L):\n    lean.queue.submit_sequence(c, [])\n    q.reserve(2)\n"
                     "    L.queues[0].submit([c])\n    dispatcher.submit(job)\n    plan.submit(mapping)\n")
    assert sorted(call for _, call in _submitting_calls(tree)) == [
        "L.queues[0].submit(...)", "lean.queue.submit_sequence(...)", "q.reserve(...)"]
