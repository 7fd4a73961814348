"""A jit capture is deterministic and its verification compares the captured programs themselves
(issues 33.2 and 34): tinygrad's plain-def training step replays (SGD and Adam, with and without
BatchNorm), whatever thread plans its realizes; a function whose program changes between calls raises
JitError with the schedule cache on or off and with race checks on, and the error names what differed
(which realize and task, which buffer, which draw)."""
from __future__ import annotations

import numpy as np
import pytest

import atensor
from atensor import Tensor, nn
from atensor.nn.optim import SGD, Adam
from atensor.nn.state import get_parameters

from tests.engine.settings_modes import settings_mode

pytestmark = pytest.mark.default_settings


class _Net:
    def __init__(self, batchnorm: bool):
        self.l1, self.l2 = nn.Linear(6, 8), nn.Linear(8, 3)
        self.bn = nn.BatchNorm(8) if batchnorm else None

    def __call__(self, x: Tensor) -> Tensor:
        h = self.l1(x)
        if self.bn is not None:
            h = self.bn(h)
        return self.l2(h.relu())


def _losses(batchnorm: bool, optimizer: type, jit: bool, calls: int = 6) -> tuple[list[float], object]:
    Tensor.manual_seed(0)
    model = _Net(batchnorm)
    opt = optimizer(get_parameters(model), lr=0.05)
    rng = np.random.default_rng(0)
    X = Tensor(rng.standard_normal((32, 6)).astype(np.float32))
    Y = Tensor(rng.integers(0, 3, 32).astype(np.int32))

    @Tensor.train()
    def train_step():   # tinygrad's idiom, as a plain def
        opt.zero_grad()
        idx = Tensor.randint(8, high=32)
        loss = model(X[idx]).sparse_categorical_crossentropy(Y[idx]).backward()
        return loss.realize(*opt.schedule_step())
    step = atensor.TinyJit(train_step) if jit else train_step
    return [step().item() for _ in range(calls)], step


# every optimizer and model under the default settings and with every realize planned on the
# dispatcher thread (where the capture used to collect pending assigns in another order on each call);
# one case each with race checks on and with the schedule cache off
CASES = [(mode, optimizer, batchnorm) for mode in ("default", "dispatcher") for optimizer in (SGD, Adam)
         for batchnorm in (False, True)] + [("racecheck", Adam, True), ("no_schedule_cache", SGD, True)]


@pytest.mark.parametrize("mode, optimizer, batchnorm", CASES)
def test_tinygrads_plain_def_training_step_replays(mode, optimizer, batchnorm, monkeypatch):
    with settings_mode(mode, monkeypatch):
        eager, _ = _losses(batchnorm, optimizer, jit=False)
        jitted, step = _losses(batchnorm, optimizer, jit=True)
    assert step.stats["replays"] == 3
    np.testing.assert_allclose(jitted, eager, rtol=2e-4, atol=1e-6)


@pytest.mark.parametrize("mode", ["default", "racecheck", "no_schedule_cache", "dispatcher"])
def test_a_program_that_changes_between_calls_is_refused_under_every_setting(mode, monkeypatch):
    calls = [0]

    def body(x: Tensor) -> Tensor:
        calls[0] += 1
        return x * 2 + 1 if calls[0] % 2 else x * 3 - 1

    with settings_mode(mode, monkeypatch):
        f = atensor.jit(body)
        x = Tensor(np.ones(3, dtype=np.float32))
        assert f(x).tolist() == [3.0, 3.0, 3.0] and f(x).tolist() == [2.0, 2.0, 2.0]
        with pytest.raises(atensor.JitError, match=r"realize 1 of 1, task 1 \(mul_sub 3, then mul_add 3\)"):
            f(x)


def test_the_error_names_a_state_buffer_that_python_swapped():
    weights = [Tensor(np.ones(4, np.float32)), Tensor(np.full(4, 2.0, np.float32))]
    calls = [0]

    def body(x: Tensor) -> Tensor:
        calls[0] += 1
        return x + weights[calls[0] % 2]   # the same kernel, another buffer each call

    f = atensor.jit(body)
    x = Tensor(np.zeros(4, np.float32))
    f(x)
    f(x)
    with pytest.raises(atensor.JitError, match=r"buffer \d was existing buffer #\d+ \(float32\[4\] on CPU:0\), "
                                               r"then existing buffer #\d+"):
        f(x)


def test_the_error_names_a_random_draw_that_changed():
    calls = [0]

    def body(x: Tensor) -> Tensor:
        calls[0] += 1
        Tensor.rand(2 + calls[0] % 2).realize()   # a draw no result reads, of another size each call
        return x + 1

    f = atensor.jit(body)
    x = Tensor(np.zeros(4, np.float32))
    f(x)
    f(x)
    with pytest.raises(atensor.JitError, match="different programs"):
        f(x)
