"""Fixtures the example tests share."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def llm_server_process():
    """examples/serve_llm.py running (URL, process), once for every module that uses it."""
    from tests.examples.llm_server import running_server
    yield from running_server()
