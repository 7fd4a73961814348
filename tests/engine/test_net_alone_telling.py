"""engine/net_replay.py `NetAlone.start`: a one-net-command replay tells its buffers of the command only
when the command leaves the calling thread (submitted to the queue's worker, before the submission) or
fails there (before the failure reaches the queue); finished there, it tells nothing and clears the
written buffers' failures, as a write's note would. A stand-in `Runner.here` plays each outcome; no MPI
is needed (tests/dist runs the real one under mpiexec, against numpy)."""
from __future__ import annotations

import pytest

from atensor.engine.net_replay import NetAlone


class Buf:
    """What `start` reads of a buffer: its failure."""

    def __init__(self, failure=None):
        self.failure = failure


def alone(here, written=(1,)) -> NetAlone:
    """A NetAlone with only what `start` uses: the runner's `here` and the written buffers' indexes."""
    net = object.__new__(NetAlone)
    net.here, net.written, net.told = here, written, None
    return net


def test_a_command_finished_here_tells_nothing_and_clears_the_written_buffers_failures():
    told = []
    bufs = [Buf(RuntimeError("read, not written")), Buf(RuntimeError("an earlier failed write"))]
    net = alone(lambda submit, first: True)
    net.tell_later(lambda *args: told.append(args), bufs, ["signal"], [4])
    assert net.start(lambda: pytest.fail("submitted"), True) is True
    assert told == [] and net.told is None
    assert bufs[1].failure is None and isinstance(bufs[0].failure, RuntimeError)  # only the written one


def test_a_command_handed_to_the_worker_tells_the_buffers_before_it_is_submitted():
    events = []
    bufs = [Buf(), Buf(RuntimeError("an earlier failed write"))]

    def here(submit, first):
        events.append("started")
        submit()
        return False
    net = alone(here)
    net.tell_later(lambda b, signals, bases: events.append(("told", b, signals, bases)), bufs, ["signal"], [4])
    assert net.start(lambda: events.append("submitted"), True) is False
    assert events == ["started", ("told", bufs, ["signal"], [4]), "submitted"] and net.told is None
    assert isinstance(bufs[1].failure, RuntimeError)  # the told note clears it, not `start`


@pytest.mark.parametrize("submitted_first", [False, True])
def test_a_command_failing_here_tells_the_buffers_once_before_the_failure_is_raised(submitted_first):
    events = []

    def here(submit, first):
        if submitted_first:
            submit()
        raise RuntimeError("MPI error code 7")
    net = alone(here)
    net.tell_later(lambda *args: events.append("told"), [Buf(), Buf()], ["signal"], [4])
    with pytest.raises(RuntimeError, match="MPI error code 7"):
        net.start(lambda: events.append("submitted"), True)
    assert events == (["told", "submitted"] if submitted_first else ["told"]) and net.told is None
