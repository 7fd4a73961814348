"""examples/http_server.py: the HTTP/1.1 layer of the embedding server (h11 on trio sockets), with a
small echo handler: keep-alive, pipelining, 100-continue, size limits, malformed requests, handler
errors, disconnects and graceful shutdown, each seen from a raw client socket."""
from __future__ import annotations

import json
import sys
import time
from functools import partial
from pathlib import Path

import pytest
import trio
import trio.testing

h11 = pytest.importorskip("h11", reason="the server speaks HTTP with h11 (pip install h11)")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from http_server import HttpServer, LoopPacer, Request, Response, error_response, json_response  # noqa: E402


class EchoApp:
    """/echo answers what it got; /wait waits (inside until_disconnect) until `release` is set;
    /boom raises."""

    def __init__(self) -> None:
        self.release = trio.Event()
        self.waiting = 0
        self.cancelled = 0

    async def __call__(self, request: Request) -> Response:
        if request.path == "/echo":
            return json_response(200, {"method": request.method, "query": request.query,
                                       "body": request.body.decode()})
        if request.path == "/wait":
            return json_response(200, await request.until_disconnect(self._wait))
        if request.path == "/boom":
            raise RuntimeError("the handler broke")
        return error_response(404, f"no route {request.path}")

    async def _wait(self) -> str:
        self.waiting += 1
        try:
            await self.release.wait()
        except trio.Cancelled:
            self.cancelled += 1
            raise
        finally:
            self.waiting -= 1
        return "released"


async def start(nursery: trio.Nursery, **options) -> tuple[HttpServer, EchoApp, int, trio.Event]:
    app, stop = EchoApp(), trio.Event()
    server = HttpServer(app, **options)
    port = await nursery.start(partial(server.serve, "127.0.0.1", 0, stop))
    return server, app, port, stop


async def wait_until(predicate, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.005)


def request_bytes(method: str, target: str, body: bytes = b"", extra: str = "") -> bytes:
    return (f"{method} {target} HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n{extra}\r\n").encode() + body


async def read_responses(stream: trio.SocketStream, count: int) -> list[tuple[int, dict, dict]]:
    """`count` responses as (status, lower-cased headers, JSON body)."""
    conn = h11.Connection(h11.CLIENT)
    # the client side of h11 needs the requests it sent to pair responses with them
    out: list[tuple[int, dict, dict]] = []
    status, headers, body = 0, {}, b""
    while len(out) < count:
        if conn.our_state is h11.IDLE:
            conn.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
            conn.send(h11.EndOfMessage())
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(1 << 16)
            conn.receive_data(data)
        elif isinstance(event, h11.Response):
            status, headers, body = event.status_code, {k.decode(): v.decode() for k, v in event.headers}, b""
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            out.append((status, headers, json.loads(body)))
            if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                conn.start_next_cycle()
        elif isinstance(event, h11.ConnectionClosed):
            break
    return out


async def test_keep_alive_and_pipelined_requests_are_answered_in_order(nursery):
    server, app, port, stop = await start(nursery)
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(request_bytes("POST", "/echo?x=1", b"first"))
    [(status, _, body)] = await read_responses(stream, 1)
    assert (status, body) == (200, {"method": "POST", "query": "x=1", "body": "first"})
    # three at once, the middle one waiting inside until_disconnect (whose watcher reads the third)
    await stream.send_all(request_bytes("POST", "/echo", b"second") + request_bytes("GET", "/wait")
                          + request_bytes("POST", "/echo", b"third"))
    await wait_until(lambda: app.waiting == 1)
    app.release.set()
    got = await read_responses(stream, 3)
    assert [(s, b) for s, _, b in got] == [(200, {"method": "POST", "query": "", "body": "second"}),
                                          (200, "released"),
                                          (200, {"method": "POST", "query": "", "body": "third"})]
    await stream.aclose()


async def test_expect_100_continue_gets_the_interim_reply_before_the_body(nursery):
    server, app, port, stop = await start(nursery)
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\n")
    with trio.fail_after(5):
        interim = await stream.receive_some(1 << 16)
    assert interim.startswith(b"HTTP/1.1 100 ")
    await stream.send_all(b"hello")
    [(status, _, body)] = await read_responses(stream, 1)
    assert (status, body["body"]) == (200, "hello")


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_body_over_the_limit_gets_413_and_the_client_reads_it(nursery, chunked):
    server, app, port, stop = await start(nursery, max_body_bytes=1000)
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    body = b"x" * 300_000  # more than the socket buffers: the server must read it to let the client finish
    if chunked:
        head = b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
        raw = head + b"".join(b"%x\r\n%s\r\n" % (1000, body[i:i + 1000]) for i in range(0, len(body), 1000))
        raw += b"0\r\n\r\n"
    else:
        raw = request_bytes("POST", "/echo", body)
    await stream.send_all(raw)
    [(status, headers, reply)] = await read_responses(stream, 1)
    assert status == 413 and "larger than 1000 bytes" in reply["error"]
    assert headers["connection"] == "close"
    async with await trio.open_tcp_stream("127.0.0.1", port) as other:  # the server goes on
        await other.send_all(request_bytes("POST", "/echo", b"small"))
        assert (await read_responses(other, 1))[0][0] == 200


async def test_malformed_http_gets_a_400_json_error_and_the_connection_closes(nursery):
    server, app, port, stop = await start(nursery)
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(b"NOT AN HTTP REQUEST\r\n\r\n")
    [(status, headers, reply)] = await read_responses(stream, 1)
    assert status == 400 and reply["error"].startswith("malformed HTTP request")
    with trio.fail_after(5):
        assert await stream.receive_some(1 << 16) == b""  # closed


async def test_a_client_gone_before_its_error_reply_does_not_break_the_server():
    """The 413 and 400 replies go to clients that may have left already: sending them must not raise
    out of the connection (it would take the server down with it)."""
    server = HttpServer(EchoApp(), max_body_bytes=1000)
    for raw in (request_bytes("POST", "/echo", b"x" * 2000), b"NOT AN HTTP REQUEST\r\n\r\n"):
        client, server_side = trio.testing.memory_stream_pair()
        await client.send_all(raw)
        await client.aclose()  # gone before the server answers
        with trio.fail_after(10):
            await server._connection(server_side)  # returns, raises nothing
    assert server.connections == 0


async def test_a_handler_error_is_a_500_json_answer_and_the_connection_stays_usable(nursery):
    server, app, port, stop = await start(nursery)
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(request_bytes("GET", "/boom") + request_bytes("POST", "/echo", b"after"))
    got = await read_responses(stream, 2)
    assert got[0][0] == 500 and got[0][2] == {"error": "internal error: RuntimeError: the handler broke"}
    assert (got[1][0], got[1][2]["body"]) == (200, "after")


async def test_a_client_that_disconnects_cancels_the_handlers_wait(nursery):
    server, app, port, stop = await start(nursery)
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(request_bytes("GET", "/wait"))
    await wait_until(lambda: app.waiting == 1)
    await stream.aclose()
    await wait_until(lambda: app.cancelled == 1 and server.connections == 0)
    async with await trio.open_tcp_stream("127.0.0.1", port) as other:
        await other.send_all(request_bytes("POST", "/echo", b"next"))
        assert (await read_responses(other, 1))[0][2]["body"] == "next"


async def test_graceful_shutdown(nursery):
    server, app, port, stop = await start(nursery)
    idle = await trio.open_tcp_stream("127.0.0.1", port)
    await idle.send_all(request_bytes("POST", "/echo", b"then idle"))
    assert (await read_responses(idle, 1))[0][0] == 200
    busy = await trio.open_tcp_stream("127.0.0.1", port)
    await busy.send_all(request_bytes("GET", "/wait"))
    await wait_until(lambda: app.waiting == 1)
    stop.set()
    with trio.fail_after(5):
        assert await idle.receive_some(1 << 16) == b""  # the idle kept-alive connection is closed
    with pytest.raises(OSError):
        await trio.open_tcp_stream("127.0.0.1", port)  # the listener is closed
    app.release.set()
    [(status, headers, body)] = await read_responses(busy, 1)  # the request in flight finishes
    assert (status, body, headers["connection"]) == (200, "released", "close")
    await wait_until(lambda: server.connections == 0)


async def test_shutdown_cancels_what_outlives_the_graceful_timeout():
    app, stop = EchoApp(), trio.Event()
    server = HttpServer(app, graceful_timeout=0.2)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(partial(server.serve, "127.0.0.1", 0, stop))
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(request_bytes("GET", "/wait"))
        await wait_until(lambda: app.waiting == 1)
        stop.set()
        with trio.fail_after(5):
            assert await stream.receive_some(1 << 16) == b""  # cancelled, the connection closed
    assert app.cancelled == 1  # and serve returned: the nursery exited


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def test_the_pacer_queues_steps_once_the_batch_is_over_budget_and_lets_one_go_per_iteration(nursery):
    pacer = LoopPacer(budget_s=0.02)
    trio.lowlevel.add_instrument(pacer)
    nursery.start_soon(pacer.run)
    try:
        await trio.sleep(0.001)  # an I/O wait: a new scheduler batch starts
        with trio.CancelScope() as scope:
            scope.cancel()
            await pacer.step()  # cheap so far: not even a checkpoint (the pending cancel stays pending)
        assert not scope.cancelled_caught and pacer.yields == 0

        order: list[str] = []

        async def costly(name: str) -> None:
            _spin(0.03)  # over budget
            await pacer.step()
            order.append(name)

        async def cheap() -> None:  # like /health: takes no turn
            order.append("cheap")

        async with trio.open_nursery() as inner:
            for name in "abc":
                inner.start_soon(costly, name)
            await trio.sleep(0)  # the three spin in one batch and queue
            inner.start_soon(cheap)
        assert pacer.yields == 3 and sorted(order) == ["a", "b", "c", "cheap"]
        assert order.index("cheap") <= 1  # one queued step per iteration: the cheap task got in first
    finally:
        trio.lowlevel.remove_instrument(pacer)
