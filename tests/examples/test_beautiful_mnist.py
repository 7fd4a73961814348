"""examples/beautiful_mnist.py, tinygrad's example with only its imports changed, run as a script on the
local digits (nn.datasets.mnist): with a shorter run than tinygrad's 70 steps of 512 (its own STEPS and
BS knobs), it must pass its own TARGET_EVAL_ACC_PCT=95 check, which raises below the target."""
from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

from atensor import Context

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "beautiful_mnist.py"


@pytest.mark.default_settings  # as a user runs it: race proofs off
def test_beautiful_mnist_reaches_95_percent_on_the_local_digits(monkeypatch, capsys):
    for name, value in {"STEPS": "30", "BS": "128", "TARGET_EVAL_ACC_PCT": "95"}.items():
        monkeypatch.setenv(name, value)
    # one BLAS thread: on a machine whose cores other processes hold, OpenBLAS's spinning threads made
    # this run 8x slower in CPU time (bench/conv.py's note); on an idle one it costs little
    with Context(blas_threads=1):
        runpy.run_path(str(EXAMPLE), run_name="__main__")
    out = capsys.readouterr()
    accuracy = float(re.search(r"test_acc=([0-9.]+) >= 95", out.out).group(1))
    assert 95 <= accuracy < 100
    assert "30/30" in out.err  # its trange ran every step


def test_the_port_changed_only_import_lines():
    """Every line but the header comment and the imports reads as tinygrad's does: no atensor name
    outside the imports."""
    code = [line for line in EXAMPLE.read_text().splitlines() if line and not line.startswith("#")]
    imports = [line for line in code if line.startswith(("from ", "import "))]
    assert imports == ["from typing import Callable",
                       "from atensor import Tensor, TinyJit, nn, GlobalCounters, Context, function",
                       "from atensor.helpers import getenv, colored, trange",
                       "from atensor.nn.datasets import mnist"]
    assert not [line for line in code if "atensor" in line and line not in imports]
