"""The LLM server the example tests share: examples/serve_llm.py started once per test session (its
warm-up is the longest setup of the suite), while transformers' reference is computed meanwhile.

Started as soon as collection shows a test that uses it (tests/examples/conftest.py's
`pytest_collection_finish`), so its warm-up (29 s quiet, 48-150 s under load) runs beside the
tests collected before the first one that needs it instead of in that test's setup; the fixture then only
waits for /health. A session that never reaches the fixture (-x, a keyboard interrupt) stops it at exit."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
SLOTS, WAITING, CONTEXT = 4, 6, 512  # 512: a prompt with tools (their system prompt) is ~300-400 tokens


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reference_while_the_server_warms_up() -> None:
    """Computes (or reads) transformers' cached reference while the server captures its steps: the two
    took ~50 s each one after the other, the longest setups of the suite."""
    from tests.models.test_llama import _reference
    try:
        _reference()
    except pytest.skip.Exception:
        pass  # no torch: the tests that need the reference skip on their own


@dataclass
class StartedServer:
    """examples/serve_llm.py started with this module's flags: its URL and process."""
    url: str
    proc: subprocess.Popen


_started: Optional[StartedServer] = None  # started ahead of the fixture (`start_early`), not yet taken


def _start() -> StartedServer:
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, str(ROOT / "examples" / "serve_llm.py"), "--port", str(port),
                             "--slots", str(SLOTS), "--max-waiting", str(WAITING), "--context", str(CONTEXT),
                             "--prefill-buckets", "16", "64",
                             "--no-background-warmup"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    return StartedServer(f"http://127.0.0.1:{port}", proc)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def start_early() -> None:
    """Starts the server now, for `running_server` to take later (once; not with ATENSOR_TEST_LLM_URL)."""
    global _started
    if _started is None and not os.environ.get("ATENSOR_TEST_LLM_URL"):
        _started = _start()


def stop_unused() -> None:
    """Stops a server `start_early` started that no fixture took."""
    global _started
    if _started is not None:
        _stop(_started.proc)
        _started = None


def running_server():
    """Starts the server (or takes the one `start_early` started), yields (its URL, its process), stops
    it. Its background warm-up is off: it would compete for the 2 cores with the tests' requests (~20 s of
    the suite), and the batcher's and the model's tests cover it. With ATENSOR_TEST_LLM_URL set (a server
    already started with this module's flags, for working on the tests), yields (that URL, None)."""
    global _started
    import httpx
    if os.environ.get("ATENSOR_TEST_LLM_URL"):
        yield os.environ["ATENSOR_TEST_LLM_URL"], None
        return
    started, _started = _started or _start(), None
    url, proc = started.url, started.proc
    deadline = time.monotonic() + 600
    try:
        _reference_while_the_server_warms_up()
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"serve_llm.py exited: {proc.stdout.read().decode()[-3000:]}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("serve_llm.py did not start within 600 s")
            time.sleep(0.5)
        yield url, proc
    finally:
        _stop(proc)
