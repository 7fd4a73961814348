"""Mutation under concurrency: realizes issued from many trio tasks serialize in issue order, a write
waits for earlier readers (write after read), and random programs of creations, views, assigns,
setitems and reads give the same reads as numpy run eagerly, with every realize issued from its own
trio task and awaited concurrently.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import trio
from hypothesis import given, settings, strategies as st

from atensor import Tensor


async def test_assigns_from_two_tasks_apply_in_the_order_their_realizes_were_issued():
    t = Tensor(np.zeros(4, dtype=np.int32))
    seen: dict[str, list[int]] = {}
    issued: list[str] = []
    second_may_issue = trio.Event()

    async def writer(name: str, value: int, wait: trio.Event | None, then: trio.Event | None) -> None:
        if wait is not None:
            await wait.wait()
        t.assign(t * 10 + value)
        snapshot = t + 0  # what this task reads back, captured right after its own write
        handle = Tensor.realize(t, snapshot)
        issued.append(name)
        if then is not None:
            then.set()
        await handle
        seen[name] = snapshot.tolist()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer, "second", 2, second_may_issue, None)
        nursery.start_soon(writer, "first", 1, None, second_may_issue)
    assert issued == ["first", "second"]
    assert seen["first"] == [1, 1, 1, 1]
    assert seen["second"] == [12, 12, 12, 12]
    assert t.tolist() == [12, 12, 12, 12]


async def test_a_write_waits_for_an_earlier_realize_that_still_reads_the_buffer():
    rng = np.random.default_rng(3)
    data = rng.standard_normal((384, 384)).astype(np.float32)
    t = Tensor(data)
    # a slow reader: several matmuls over t, issued first and not awaited yet
    reader = ((t @ t).tanh() @ t).sum(axis=0)
    read_handle = reader.realize()
    t.assign(t * 0 - 1)
    write_handle = t.realize()
    await write_handle
    await read_handle
    expected = (np.tanh(data.astype(np.float64) @ data) @ data).sum(axis=0)
    np.testing.assert_allclose(reader.numpy(), expected, rtol=2e-3, atol=2e-2)
    assert (t.numpy() == -1).all()


# ---- random programs vs numpy ------------------------------------------------------------------------
# A program is a list of steps over a growing list of *aliases*: each alias is (storage id, index) and
# names the same memory in numpy (a basic-indexing view) and in atensor (a view tensor of storage).

SHAPES = [(6,), (4, 5), (3, 4)]
LENGTH = 18  # steps per program, at most


@dataclass
class Step:
    kind: str
    args: tuple


def _index_for(shape: tuple[int, ...], draw: Callable[[Any], Any]) -> tuple:
    index = []
    for size in shape:
        choice = draw(st.integers(0, 3))
        if choice == 1 and size == 0:
            choice = 0
        if choice == 0:
            index.append(slice(None))
        elif choice == 1:
            index.append(draw(st.integers(-size, size - 1)))
        else:
            start = draw(st.integers(0, size))
            stop = draw(st.integers(0, size))
            step = draw(st.sampled_from([1, 2, -1, -2]))
            index.append(slice(start, stop, step))
    return tuple(index)


@st.composite
def programs(draw) -> list[Step]:
    """Random programs; every step refers only to aliases that exist by then."""
    steps: list[Step] = []
    shapes: list[tuple[int, ...]] = []  # shape of each alias

    def numpy_shape(shape, index):
        return np.empty(shape)[index].shape

    for _ in range(draw(st.integers(3, LENGTH))):
        kind = draw(st.sampled_from(["create", "view", "assign", "setitem", "setitem", "read", "read",
                                     "realize", "transpose", "clone", "scatter", "realize2"]))
        kind = kind if shapes else "create"
        if kind == "create":
            shape = draw(st.sampled_from(SHAPES))
            seed = draw(st.integers(0, 1000))
            steps.append(Step("create", (shape, seed, draw(st.sampled_from(["CPU", "CPU", "CPU:1"])))))
            shapes.append(shape)
        elif kind == "scatter":  # setitem with an integer tensor along the first axis
            dst = draw(st.integers(0, len(shapes) - 1))
            if not shapes[dst] or shapes[dst][0] == 0:
                continue
            n = shapes[dst][0]
            rows = draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=3))
            scale, shift = draw(st.integers(-3, 3)), draw(st.integers(-5, 5))
            steps.append(Step("scatter", (dst, rows, scale, shift)))
        elif kind == "realize2":
            pair = (draw(st.integers(0, len(shapes) - 1)), draw(st.integers(0, len(shapes) - 1)))
            steps.append(Step("realize2", pair))
        elif kind == "view":
            src = draw(st.integers(0, len(shapes) - 1))
            index = _index_for(shapes[src], draw)
            steps.append(Step("view", (src, index)))
            shapes.append(numpy_shape(shapes[src], index))
        elif kind in ("transpose", "clone"):
            src = draw(st.integers(0, len(shapes) - 1))
            steps.append(Step(kind, (src,)))
            shapes.append(tuple(reversed(shapes[src])) if kind == "transpose" else shapes[src])
        elif kind in ("assign", "setitem"):
            dst = draw(st.integers(0, len(shapes) - 1))
            index = _index_for(shapes[dst], draw) if kind == "setitem" else ()
            target_shape = numpy_shape(shapes[dst], index) if kind == "setitem" else shapes[dst]
            same = [i for i, s in enumerate(shapes) if s == target_shape]
            other = draw(st.sampled_from(same)) if same and draw(st.booleans()) else None
            scale, shift = draw(st.integers(-3, 3)), draw(st.integers(-5, 5))
            steps.append(Step(kind, (dst, index, other, scale, shift)))
        elif kind == "read":
            steps.append(Step("read", (draw(st.integers(0, len(shapes) - 1)),)))
        else:
            steps.append(Step("realize", (draw(st.integers(0, len(shapes) - 1)),)))
    return steps


async def _run(program: list[Step]) -> None:
    np_alias: list[np.ndarray] = []
    at_alias: list[Tensor] = []
    previous_issued = trio.Event()
    previous_issued.set()
    failures: list[str] = []

    async def realize_in_order(tensor: Tensor | tuple[Tensor, Tensor], wait: trio.Event, issued: trio.Event,
                               expected: np.ndarray | None, where: str) -> None:
        await wait.wait()
        await trio.sleep(0)
        handle = Tensor.realize(*tensor) if isinstance(tensor, tuple) else tensor.realize()  # issued in order
        issued.set()
        await handle
        if expected is not None and not np.array_equal(tensor.numpy(), expected):
            failures.append(f"{where}: got {tensor.numpy().tolist()}, numpy says {expected.tolist()}")

    async with trio.open_nursery() as nursery:
        for number, step in enumerate(program):
            if step.kind == "create":
                shape, seed, device = step.args
                data = np.random.default_rng(seed).integers(-9, 10, size=shape).astype(np.int32)
                np_alias.append(data.copy())
                at_alias.append(Tensor(data, device=device))
            elif step.kind == "scatter":
                dst, rows, scale, shift = step.args
                target = np_alias[dst]
                target[rows] = target[rows] * np.int32(scale) + np.int32(shift)
                index = Tensor(np.array(rows, dtype=np.int32), device=at_alias[dst].device)
                at_alias[dst][index] = at_alias[dst][index] * scale + shift
            elif step.kind == "realize2":
                a, b = step.args
                issued = trio.Event()
                nursery.start_soon(realize_in_order, (at_alias[a], at_alias[b]), previous_issued, issued,
                                   None, f"step {number} (realize of aliases {a} and {b})")
                previous_issued = issued
                await issued.wait()
            elif step.kind == "view":
                src, index = step.args
                np_alias.append(np_alias[src][index + (Ellipsis,)])
                at_alias.append(at_alias[src][index])
            elif step.kind == "transpose":
                (src,) = step.args
                np_alias.append(np_alias[src].T)
                at_alias.append(at_alias[src].T)
            elif step.kind == "clone":  # new storage, filled lazily with the value at this point
                (src,) = step.args
                np_alias.append(np_alias[src].copy())
                at_alias.append(at_alias[src].clone())
            elif step.kind in ("assign", "setitem"):
                dst, index, other, scale, shift = step.args
                np_target = np_alias[dst][index + (Ellipsis,)] if step.kind == "setitem" else np_alias[dst]
                source_np = np_alias[other] if other is not None else np_target
                source_at = at_alias[other].to(at_alias[dst].device) if other is not None else (
                    at_alias[dst][index] if step.kind == "setitem" else at_alias[dst])
                np_target[...] = source_np * np.int32(scale) + np.int32(shift)
                value = source_at * scale + shift
                if step.kind == "setitem":
                    at_alias[dst][index] = value
                else:
                    at_alias[dst].assign(value)
            else:
                (src,) = step.args
                tensor = at_alias[src] + 0 if step.kind == "read" else at_alias[src]
                expected = np_alias[src].copy() if step.kind == "read" else None
                issued = trio.Event()
                nursery.start_soon(realize_in_order, tensor, previous_issued, issued, expected,
                                   f"step {number} ({step.kind} of alias {src})")
                previous_issued = issued
                # the program goes on once its realize is issued (not done): a live tensor realizes
                # the versions that exist when realize() is called, so issuing it later would also
                # realize later writes (still correct values, but no longer this program's order)
                await issued.wait()
    # afterwards every alias, read through its own view, matches numpy
    final = [t + 0 for t in at_alias]
    await Tensor.realize(*final)
    for i, (t, ref) in enumerate(zip(final, np_alias)):
        if not np.array_equal(t.numpy(), ref):
            failures.append(f"final alias {i}: got {t.numpy().tolist()}, numpy says {ref.tolist()}")
    assert not failures, "\n".join(failures)


@settings(max_examples=60, deadline=None)
@given(programs())
def test_random_programs_with_concurrent_realizes_match_numpy_run_eagerly(program):
    trio.run(_run, program)
