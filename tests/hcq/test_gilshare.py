"""hcq/gilshare.py: while a thread is inside `gil_shared`, the interpreter's switch interval is at most
the process-wide setting `loop_switch_us`; the interval found comes back when the last thread leaves,
unless the application set its own meanwhile."""
from __future__ import annotations

import sys
import threading
import time

import pytest

from atensor.config import process_settings
from atensor.hcq import gilshare
from atensor.hcq.gilshare import gil_shared


@pytest.fixture
def interval(monkeypatch):
    """The default interval (5 ms), the default setting (500 us) and a pump every 300 us for the test;
    restored after."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    monkeypatch.setattr(process_settings(), "loop_switch_us", 500)
    monkeypatch.setattr(process_settings(), "loop_pump_us", 300)  # (off by default: on for these tests)
    yield
    sys.setswitchinterval(old)


def test_inside_the_interval_is_the_setting_and_the_one_found_comes_back(interval):
    with gil_shared():
        assert sys.getswitchinterval() == pytest.approx(500e-6)
        inside = gilshare.statistics()
        assert {k: inside[k] for k in ("threads_inside", "switch_interval_s", "lowered", "pumping")} == {
            "threads_inside": 1, "switch_interval_s": sys.getswitchinterval(), "lowered": True, "pumping": True}
    assert sys.getswitchinterval() == pytest.approx(0.005)
    assert gilshare.statistics()["threads_inside"] == 0


def test_the_interval_comes_back_when_the_block_raises(interval):
    with pytest.raises(ValueError):
        with gil_shared():
            raise ValueError("planning failed")
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_threads_entering_and_leaving_in_any_order_restore_it_only_when_the_last_leaves(interval):
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, float] = {}

    def first() -> None:
        with gil_shared():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second() -> None:
        first_in.wait(5)
        with gil_shared():
            second_in.set()
            first_out.wait(5)  # the first thread has left: the second is still inside
            seen["after first left"] = sys.getswitchinterval()
    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen["after first left"] == pytest.approx(500e-6)
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_an_interval_the_application_sets_meanwhile_is_kept(interval):
    with gil_shared():
        sys.setswitchinterval(0.002)  # the application's own choice, made while atensor plans
    assert sys.getswitchinterval() == pytest.approx(0.002)


def test_a_shorter_interval_already_in_force_is_left_alone(interval):
    sys.setswitchinterval(100e-6)
    with gil_shared():
        assert sys.getswitchinterval() == pytest.approx(100e-6)
        assert not gilshare.statistics()["lowered"]
    assert sys.getswitchinterval() == pytest.approx(100e-6)


def test_a_setting_of_zero_leaves_the_interval_alone(interval, monkeypatch):
    monkeypatch.setattr(process_settings(), "loop_switch_us", 0)
    with gil_shared():
        assert sys.getswitchinterval() == pytest.approx(0.005)
        assert not gilshare.statistics()["pumping"]  # (and no pump)
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_a_pump_takes_the_gil_while_a_thread_is_inside_and_stops_when_the_last_leaves(interval):
    """hcq/gilshare.py's pump: while the dispatcher plans, a pump thread takes the GIL every `loop_pump_us`,
    so the planner gives up its core at those points without the GIL (not preempted holding it)."""
    with gilshare.gil_shared():
        before = gilshare.statistics()["pump_turns"]
        end = time.perf_counter() + 0.1
        while time.perf_counter() < end:  # pure Python, as planning is: the pump gets its turns all the same
            sum(range(200))
        inside = gilshare.statistics()
    assert inside["pumping"] and inside["pump_turns"] - before >= 10  # (0.1 s / 0.3 ms: ~120 expected)
    assert not gilshare.statistics()["pumping"]
    time.sleep(0.01)
    settled = gilshare.statistics()["pump_turns"]
    time.sleep(0.05)
    assert gilshare.statistics()["pump_turns"] <= settled + 1  # stopped (one last turn may finish)
