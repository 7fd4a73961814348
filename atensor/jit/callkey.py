"""What a jit call must repeat to be replayed (jit/jit.py): the key of its arguments' plain values,
and the key of the graphs it ran.

Why a module of its own: the jit compares the graphs of its capturing and its verifying call, and
tells a user why calls whose plain arguments change are never replayed. Both are comparisons of
keys, with bound Variables described by the variable alone (a KV cache written at another
`start_pos` is the same program), apart from how calls are captured and replayed.
"""
from __future__ import annotations

from typing import Any, Optional

from atensor.engine.dispatch import Recording
from atensor.graph import symbolic
from atensor.graph.view import View
from atensor.sched import schedule as sched


def _plain_values(shape: Any) -> list[Any]:
    """The non-tensor values in a flattened argument description, in order."""
    kind, body = shape
    if kind in ("V", "Var"):  # a plain value, or a bound Variable (described unbound)
        return [body]
    if kind == "T":
        return []
    items = [v for _, v in body] if kind == "dict" else list(body)
    return [x for item in items for x in _plain_values(item)]


def only_plain_values_differ(old: tuple, new: tuple) -> Optional[tuple[Any, Any]]:
    """(old values, new values) when two call keys differ only in their non-tensor arguments."""
    if old[1:] != new[1:]:
        return None
    a, b = _plain_values(old[0]), _plain_values(new[0])
    return (a, b) if len(a) == len(b) and a != b else None


def _unbound_key(key: Any) -> Any:
    """A schedule's structure key with the views' bound variables unbound, so that two calls at other
    values of the same variables compare equal."""
    if isinstance(key, tuple):
        return tuple([_unbound_key(k) for k in key])
    if isinstance(key, View) and key.variables():
        return key.unbind({})
    return key


def call_key(records: Recording) -> list:
    """What the verifying call must repeat: each realize's graph structure, and each draw's size and
    devices (a draw no realize reads still takes its counters)."""
    return [record_key(r) for r in records] + \
        [("draw", count, tuple(s.device for s in specs)) for specs, count in records.draws]


def record_key(record: sched.Schedule) -> Optional[tuple]:
    """The schedule's structure key, compared between the capturing and the verifying call."""
    if record.key is None or not symbolic.any_bound:  # no variable was ever bound: nothing to unbind
        return record.key
    return _unbound_key(record.key)
