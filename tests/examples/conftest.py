"""Fixtures the example tests share."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def llm_server_process():
    """examples/serve_llm.py running (URL, process), once for every module that uses it."""
    from tests.examples.llm_server import running_server
    yield from running_server()


def pytest_collection_finish(session):
    """Starts the shared LLM server as soon as a collected test needs it: its warm-up then runs beside
    the tests before that one (tests/examples/llm_server.py)."""
    if session.config.option.collectonly:
        return
    if any("llm_server_process" in getattr(item, "fixturenames", ()) for item in session.items):
        from tests.examples.llm_server import start_early
        start_early()


def pytest_unconfigure(config):
    """Stops a server started early that no test took (the session ended before the fixture)."""
    from tests.examples.llm_server import stop_unused
    stop_unused()
