"""`atensor.function`: tinygrad's decorator for a sub-graph built once and called like a kernel.

In tinygrad, `@function` traces the decorated function into one CALL node whose body is compiled once
and reused by every call with inputs of the same structure (and whose backward can be precompiled too):
a model's `__call__` becomes one reusable piece of the graph instead of being re-lowered each step.

atensor gets that reuse elsewhere: the schedule cache (sched/cache.py) keeps the TaskGraph of every
structurally equal graph, so a sub-graph built again with new inputs is not lowered again, and
`atensor.jit` replays whole steps. So `function` here is a pass-through: the decorated function runs
as written, builds the same lazy graph, and returns the same values and gradients. It keeps tinygrad's
call forms (`@function`, `@function(precompile=True)`, on functions and on methods) so ported code runs
unchanged; the keyword options are accepted and have no further effect.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Generic, Optional, TypeVar

ReturnType = TypeVar("ReturnType")


class Function(Generic[ReturnType]):
    """A function wrapped by `atensor.function`; calling it calls the function (`__wrapped__`)."""

    def __init__(self, fn: Callable[..., ReturnType], precompile: bool = False, precompile_backward: bool = False,
                 allow_implicit: bool = True, grad_fxn: Optional[Callable] = None) -> None:
        self.__wrapped__ = fn
        self.precompile, self.precompile_backward = precompile, precompile_backward
        self.allow_implicit, self.grad_fxn = allow_implicit, grad_fxn
        functools.update_wrapper(self, fn)

    def __get__(self, obj: Any, objtype: Optional[type] = None) -> Any:
        """On a class: `model.__call__` binds `model` as tinygrad's does."""
        return self if obj is None else functools.partial(self.__call__, obj)

    def __call__(self, *args: Any, **kwargs: Any) -> ReturnType:
        return self.__wrapped__(*args, **kwargs)


def function(fn: Optional[Callable[..., ReturnType]] = None, *, precompile: bool = False,
             precompile_backward: bool = False, allow_implicit: bool = True,
             grad_fxn: Optional[Callable] = None) -> Any:
    """tinygrad's `@function` / `@function(precompile=True)`: see the module docstring for what it means
    here (the decorated function, called as it is; the schedule cache reuses its graph).

    >>> from atensor import Tensor
    >>> @function
    ... def double(x): return x * 2
    >>> double(Tensor([1, 2])).tolist()
    [2, 4]
    """
    if grad_fxn is not None:
        raise NotImplementedError("atensor.function(grad_fxn=...) : atensor has no custom gradients; "
                                  "see docs/porting.md")

    def wrap(f: Callable[..., ReturnType]) -> Function[ReturnType]:
        return Function(f, precompile, precompile_backward, allow_implicit)
    return wrap if fn is None else wrap(fn)
