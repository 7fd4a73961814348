"""`Submission`: what one submission put on the queues, as a typed record.

Why apart from engine/plan.py: the plan (the one module that submits) makes it, and the dispatcher, the
realize, captured programs and the jit read it (its waits, its first failure) without needing the plan's
lowering; a reader of those modules learns the record here, in one page.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from atensor.graph.taskgraph import Task
from atensor.hcq.queue import DependencyFailed, Queue
from atensor.hcq.signal import Signal


@dataclass
class Submission:
    """What one submission put on the queues: the last value per queue and each task's place."""
    final: dict[Queue, int] = field(default_factory=dict)
    placed: list[tuple[Signal, int, Task]] = field(default_factory=list)

    def waits(self) -> list[tuple[Signal, int]]:
        """The (signal, value) pairs that are all reached once every command of it has run."""
        return [(q.signal, v) for q, v in self.final.items()]

    def settled(self) -> bool:
        """True when every command of it has run and none of its queues ever had a value fail: nothing is
        left to await or to report (a net command finished on the submitting thread, a tiny plan run
        there). A queue that ever failed answers False, so its failures are looked for by a handle."""
        for queue, value in self.final.items():
            signal = queue.signal
            if signal.value < value or signal.has_failures():
                return False
        return True

    def first_failure(self) -> Optional[BaseException]:
        """The root-cause error of the graph (a failed task, not one that was skipped because of it)."""
        if not any(queue.signal.has_failures() for queue in self.final):
            return None  # the common case: no value of these queues ever failed
        skipped: Optional[BaseException] = None
        for signal, value, _ in self.placed:
            err = signal.failure(value)
            if err is None:
                continue
            if not isinstance(err, DependencyFailed):
                return err
            skipped = skipped or err
        return skipped
