"""tinygrad's `helpers` names that ported programs import: `getenv`, `colored`, `trange`, `tqdm`.

`from tinygrad.helpers import getenv, colored, trange` becomes `from atensor.helpers import ...` and the
program runs unchanged. A name tinygrad's helpers have and these do not raises an ImportError that
names docs/porting.md (`missing.py`).
"""
from __future__ import annotations

import sys
import time
from typing import Generic, Iterable, Iterator, Optional, TypeVar

from atensor.config import getenv
from atensor.porting import missing_name

__all__ = ["getenv", "colored", "trange", "tqdm"]

_COLORS = ("black", "red", "green", "yellow", "blue", "magenta", "cyan", "white")
T = TypeVar("T")


def colored(text: str, color: Optional[str], background: bool = False) -> str:
    """`text` in an ANSI terminal color (tinygrad's: a lower-case name is the normal color, an upper-case
    one the bright color; `background` colors the background). `None` leaves the text as it is.

    >>> colored("ok", "green") == "\\x1b[32mok\\x1b[0m"
    True
    """
    if color is None:
        return text
    if color.lower() not in _COLORS:
        raise ValueError(f"unknown color {color!r}; one of {_COLORS} (upper case for the bright ones)")
    code = 30 + _COLORS.index(color.lower()) + (60 if color.isupper() else 0) + (10 if background else 0)
    return f"\x1b[{code}m{text}\x1b[0m"


class tqdm(Generic[T]):  # noqa: N801 - tinygrad's (and tqdm's) name
    """A progress line on stderr over an iterable: `for x in (t := tqdm(items)): t.set_description(...)`.
    Redrawn at most ten times a second, and once at the end."""

    def __init__(self, iterable: Iterable[T], desc: str = "", total: Optional[int] = None,
                 disable: bool = False) -> None:
        self.iterable, self.desc, self.disable = iterable, desc, disable
        self.total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
        self.n, self._start, self._drawn = 0, time.perf_counter(), 0.0

    def set_description(self, desc: str) -> None:
        """Shows `desc` before the count from the next redraw on."""
        self.desc = desc

    def __iter__(self) -> Iterator[T]:
        for item in self.iterable:
            yield item
            self.n += 1
            now = time.perf_counter()
            if now - self._drawn > 0.1:
                self._draw(now)
        self._draw(time.perf_counter(), end="\n")

    def _draw(self, now: float, end: str = "") -> None:
        if self.disable:
            return
        self._drawn = now
        elapsed = now - self._start
        of = f"/{self.total}" if self.total is not None else ""
        rate = self.n / elapsed if elapsed > 0 else 0.0
        sys.stderr.write(f"\r{self.desc} {self.n}{of} [{elapsed:6.1f}s, {rate:6.2f} it/s]{end}")
        sys.stderr.flush()


def trange(n: int, **kwargs: object) -> tqdm[int]:
    """`tqdm(range(n))`, as tinygrad's."""
    return tqdm(range(n), **kwargs)  # type: ignore[arg-type]


def __getattr__(name: str) -> object:
    raise missing_name("atensor.helpers", name)
