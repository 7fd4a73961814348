"""Load test of examples/serve.py against the two usual alternatives, in one run on this machine.

    python bench/serve_load.py                      # clients 1, 8, 32, 128; ~3-4 minutes
    python bench/serve_load.py --duration 3 --clients 8 32 --modes atensor torch

Each server runs in its own process on a loopback port, all the same Starlette app under the same
server (uvicorn by default, `--server hypercorn-trio` for trio):
  atensor  the example: dynamic batching, the graph built off the loop, `await model(batch).realize()`
  sync     baseline (a): a synchronous handler, atensor computing each request in the thread pool
  torch    baseline (b): sentence-transformers on PyTorch CPU through Starlette's run_in_threadpool
The previous server (a hand-written h11 layer on trio) is shown as rows read from the committed
bench/results/serve_load.json of an earlier run, labelled so: it no longer exists to be measured.

The idle atensor server is probed first, for the machine's floor in the same run.
N clients (each one kept-alive connection) send POST /embed with 1-4 sentences from a fixed mix, back
to back, for `--duration` seconds after a warm-up, from a load-generator process that runs at a lower
OS priority (`--load-nice`, 10 by default, the same for every mode: in production the clients are
other machines; here they would take the server's cores). A separate prober process, at the normal
priority, sends GET /health every 20 ms meanwhile. Clients speak HTTP with httpx. Reported:
requests/s, sentences/s, p50/p95/p99 latency and /health p50/p99/worst; figures land in
bench/results/serve_load.json. Targets: at 32 clients, atensor's throughput >= torch's, and atensor's
/health p99 <= 20 ms under load.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from common import table, write_results  # noqa: E402

SENTENCES = [
    "The cat sat on the mat.",
    "A quick brown fox jumps over the lazy dog.",
    "How do I reset my password?",
    "Tensor libraries build lazy graphs and run them on command queues.",
    "Where is the nearest train station?",
    "The weather today is sunny with a light breeze from the west.",
    "Async servers keep the event loop responsive while models compute.",
    "I would like to order two coffees and a croissant, please.",
    "Ünïcödé text: café, naïve, jalapeño.",
    "Batching requests together makes better use of matrix multiplication.",
    "What time does the museum open on Sundays?",
    "Sentence embeddings map text to vectors whose distances reflect meaning.",
    "Please send the quarterly report before Friday.",
    "Rain is expected tonight, so bring an umbrella.",
    "The library opens at nine and closes at five on weekdays.",
    "Machine learning models are often served behind HTTP APIs.",
]


def request_mix(client: int, i: int) -> list[str]:
    """Request i of a client: 1 to 4 sentences of the fixed mix (2.5 on average)."""
    count = 1 + (client + i) % 4
    start = (client * 7 + i * 3) % len(SENTENCES)
    return [SENTENCES[(start + k) % len(SENTENCES)] for k in range(count)]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


# ---- one server process ------------------------------------------------------------------------------

class ServerProcess:
    """examples/serve.py in a child process; `port` once it listens; SIGTERM to stop (graceful)."""

    def __init__(self, mode: str, devices: int, window_ms: float, pipeline: int, worker_nice: int = 5,
                 server: str = "uvicorn"):
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        cmd = [sys.executable, str(ROOT / "examples" / "serve.py"), "--port", "0", "--mode", mode,
               "--server", server,
               "--devices", str(devices), "--batch-window-ms", str(window_ms), "--pipeline", str(pipeline),
               "--worker-nice", str(worker_nice),
               "--warmup-tokens", *(["10", "14", "18"] if mode != "torch" else [])]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, cwd=ROOT)
        self.port = self._wait_for_port()

    def _wait_for_port(self, timeout: float = 900.0) -> int:
        """The port from the server's "serving ... on http://host:port" line (printed after its warm-up,
        which compiles kernels: minutes on a busy small machine)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {Path(self.log.name).read_text()[-2000:]}")
            for line in Path(self.log.name).read_text().splitlines():
                if line.startswith("serving ") and "http://" in line:
                    return int(line.rsplit(":", 1)[1].strip())
            time.sleep(0.1)
        self.proc.kill()
        self.proc.wait()
        raise TimeoutError(f"server did not start within {timeout:g} s")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.unlink(self.log.name)


# ---- the health prober (its own process: the load generator's work must not delay it) --------------

async def probe_health(port: int, seconds: float, interval: float) -> dict[str, float]:
    delays: list[float] = []
    failures = 0
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        end = trio.current_time() + seconds
        while trio.current_time() < end:
            start = time.perf_counter()
            try:
                status = (await client.get("/health")).status_code
            except Exception:  # the server dropped the connection (a stalled loop's timers): a failure
                status = 0
            delays.append(time.perf_counter() - start)
            failures += status != 200
            await trio.sleep(interval)
    return {"probes": len(delays), "failures": failures, "worst_ms": max(delays) * 1e3,
            "p50_ms": percentile(delays, 50) * 1e3, "p99_ms": percentile(delays, 99) * 1e3}


async def _probe_idle(port: int, seconds: float) -> dict[str, float]:
    """The prober alone, in its own process, against a server with no load."""
    proc = await trio.run_process([sys.executable, __file__, "--probe", str(port), str(seconds), "0.02"],
                                  capture_stdout=True)
    return json.loads(proc.stdout.decode().strip().splitlines()[-1])


# ---- the load ----------------------------------------------------------------------------------------

async def run_load(port: int, clients: int, seconds: float, warmup: float) -> dict[str, Any]:
    latencies: list[float] = []
    sentences_done = 0
    errors = 0
    start_at = trio.current_time() + warmup
    end_at = start_at + seconds

    async def client_loop(c: int) -> None:
        # requests still out at the end are abandoned (a hang-up): a slow server cannot stretch the run
        with trio.move_on_at(end_at + 0.5):
            await _client_requests(c)

    async def _client_requests(c: int) -> None:
        nonlocal sentences_done, errors
        i = 0
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            while trio.current_time() < end_at:
                sentences = request_mix(c, i)
                i += 1
                t0 = trio.current_time()
                try:
                    reply = await client.post("/embed", json={"sentences": sentences})
                    status, body = reply.status_code, reply.json()
                except Exception as exc:  # connection reset, closed mid-response, ...
                    errors += 1
                    if errors <= 3:
                        print(f"    client {c}: {type(exc).__name__}: {exc}", file=sys.stderr)
                    continue
                t1 = trio.current_time()
                if status != 200 or len(body["embeddings"]) != len(sentences):
                    errors += 1
                elif start_at <= t1 <= end_at:  # completed in the window (counted whenever it started)
                    latencies.append(t1 - t0)
                    sentences_done += len(sentences)

    async with trio.open_nursery() as nursery:
        for c in range(clients):
            nursery.start_soon(client_loop, c)
        print("started", flush=True)  # the parent starts the prober `warmup` seconds from now
    return {"clients": clients, "requests": len(latencies), "errors": errors,
            "rps": len(latencies) / seconds, "sentences_per_s": sentences_done / seconds,
            "p50_ms": percentile(latencies, 50) * 1e3, "p95_ms": percentile(latencies, 95) * 1e3,
            "p99_ms": percentile(latencies, 99) * 1e3}


async def _lines(stream: Any) -> Any:
    """The lines a child process writes, as they come."""
    pending = b""
    async for chunk in stream:
        pending += chunk
        *done, pending = pending.split(b"\n")
        for line in done:
            yield line.decode()
    if pending:
        yield pending.decode()


async def measure_point(port: int, clients: int, seconds: float, warmup: float, load_nice: int) -> dict[str, Any]:
    """One point: the load generator in its own process (at niceness `load_nice`), and the prober in
    another at the normal priority, probing during the load's measured window."""
    load = await trio.lowlevel.open_process(
        [sys.executable, __file__, "--load", str(port), str(clients), str(seconds), str(warmup), str(load_nice)],
        stdout=subprocess.PIPE)
    row: dict[str, Any] = {}
    health: dict[str, Any] = {}

    async def probe_after_start() -> None:
        await started.wait()
        await trio.sleep(warmup)  # the prober's window is the measured one
        proc = await trio.run_process([sys.executable, __file__, "--probe", str(port), str(seconds), "0.02"],
                                      capture_stdout=True)
        health.update(json.loads(proc.stdout.decode().strip().splitlines()[-1]))

    started = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(probe_after_start)
        async with load.stdout:
            async for line in _lines(load.stdout):
                if line == "started":
                    started.set()
                elif line.startswith("{"):
                    row = json.loads(line)
    await load.wait()
    if not row:
        raise RuntimeError(f"the load generator for {clients} clients failed (exit {load.returncode})")
    return row | {"health_worst_ms": health["worst_ms"], "health_p99_ms": health["p99_ms"],
                  "health_p50_ms": health["p50_ms"],
                  "health_failures": health["failures"], "load_nice": load_nice}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--modes", nargs="+", default=["atensor", "sync", "torch"],
                        choices=["atensor", "sync", "torch"])
    parser.add_argument("--duration", type=float, default=6.0, help="measured seconds per client count")
    parser.add_argument("--warmup", type=float, default=3.0,
                        help="unmeasured seconds before each measurement")
    parser.add_argument("--devices", type=int, default=1,
                        help="atensor replicas (CPU:k), one BLAS thread each")
    parser.add_argument("--batch-window-ms", type=float, default=5.0)
    parser.add_argument("--pipeline", type=int, default=1, help="atensor batches in flight per replica")
    parser.add_argument("--worker-nice", type=int, default=5,
                        help="OS niceness of the atensor server's worker threads (examples/serve.py's default)")
    parser.add_argument("--load-nice", type=int, default=10,
                        help="OS niceness of the load generator's process (all modes alike): clients "
                             "normally run on other machines, and on a small machine the 128-client "
                             "generator would otherwise take the cores the server under test needs; "
                             "0 to compete at equal priority")
    parser.add_argument("--server", choices=["uvicorn", "hypercorn-trio"], default="uvicorn",
                        help="the ASGI server every mode runs under")
    parser.add_argument("--probe", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--load", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:  # the prober child process
        port, seconds, interval = int(args.probe[0]), float(args.probe[1]), float(args.probe[2])
        print(json.dumps(trio.run(probe_health, port, seconds, interval)), flush=True)
        return
    if args.load:  # the load generator child process
        port, clients, seconds, warmup, nice = args.load
        if int(nice) > 0 and hasattr(os, "nice"):
            os.nice(int(nice))
        print(json.dumps(trio.run(run_load, int(port), int(clients), float(seconds), float(warmup))),
              flush=True)
        return
    earlier = earlier_h11_rows()  # read before this run overwrites the file
    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in args.modes}
    servers: dict[str, ServerProcess] = {}
    try:
        for mode in args.modes:  # all up at once (each started after the last is serving)
            servers[mode] = ServerProcess(mode, args.devices, args.batch_window_ms, args.pipeline,
                                          args.worker_nice, args.server)
        # the machine's own floor, in the same run: the worst /health of the idle atensor server (no
        # load at all; on a shared VM a probe now and then waits for a core whatever the server does)
        idle = None
        if "atensor" in servers:
            idle = trio.run(_probe_idle, servers["atensor"].port, args.duration)
            print(f"  idle atensor server: /health worst {idle['worst_ms']:.1f} ms, p99 {idle['p99_ms']:.1f} ms",
                  flush=True)
        for clients in args.clients:  # the modes back to back per point: the machine's load drifts slowly
            for mode in args.modes:
                row = trio.run(measure_point, servers[mode].port, clients, args.duration, args.warmup,
                               args.load_nice)
                results[mode].append(row)
                print(f"  {mode:8s} {clients:4d} clients: {row['rps']:7.1f} req/s "
                      f"{row['sentences_per_s']:7.1f} "
                      f"sent/s  p50 {row['p50_ms']:7.1f} ms  p99 {row['p99_ms']:7.1f} ms  "
                      f"/health p99 {row['health_p99_ms']:6.1f} worst {row['health_worst_ms']:7.1f} ms", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    rows = [[mode if "earlier" in mode else f"{mode} ({args.server})", r["clients"], r["rps"],
             r["sentences_per_s"], r["p50_ms"], r["p95_ms"],
             r["p99_ms"], r.get("health_p50_ms", float("nan")), r["health_p99_ms"], r["health_worst_ms"],
             r["errors"] + r["health_failures"]]
            for mode, rs in [*results.items(), *(earlier["results"].items() if earlier else [])] for r in rs]
    torch32 = next((r for r in results.get("torch", []) if r["clients"] == 32), None)
    print()
    print(table(f"serve_load: {args.duration:g} s per point, batch window {args.batch_window_ms:g} ms, "
                f"{args.devices} atensor device(s); /health probed every 20 ms",
                ["mode (server)", "clients", "req/s", "sent/s", "p50 ms", "p95 ms", "p99 ms", "/health p50 ms",
                 "/health p99 ms", "/health worst ms", "errors"],
                rows))
    if earlier:
        print(f"({earlier['label']}: not measured in this run, its machine load differs)")
    if torch32 and torch32["sentences_per_s"] > 0:
        print("sentences/s at 32 clients vs torch-in-threadpool: " + ", ".join(
            f"{mode} {r['sentences_per_s'] / max(torch32['sentences_per_s'], 1e-9):.2f}x"
            for mode, rs in results.items() for r in rs if r["clients"] == 32))
    verdict = _verdict(results)
    if idle is not None:
        verdict["lines"].append(f"idle server /health worst (this machine's floor in this run): "
                                f"{idle['worst_ms']:.1f} ms")
    for mode, rs in results.items():
        for r in rs:
            if r["requests"] == 0:
                verdict["lines"].append(f"{mode} at {r['clients']} clients: no request completed within the "
                                        f"{args.duration:g} s window (each took longer), so its latencies "
                                        f"are nan")
    for line in verdict["lines"]:
        print(line)
    path = write_results("serve_load", {"config": vars(args) | {"probe": None, "load": None}, "results": results,
                                        "idle_health": idle, "targets": verdict["targets"],
                                        "earlier_h11": earlier})
    print(f"\nwritten {path.relative_to(ROOT)}")


def earlier_h11_rows() -> dict[str, Any] | None:
    """The atensor rows of the committed results file's h11-server run (the server before this one):
    from a file written by that server's bench, or carried forward by a later run."""
    path = ROOT / "bench" / "results" / "serve_load.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("earlier_h11"):
        return data["earlier_h11"]
    if "server" in data.get("config", {}) or "atensor" not in data.get("results", {}):
        return None
    return {"label": f"h11 server, earlier run of {data.get('time', '?')}",
            "results": {"atensor (h11, earlier run)": data["results"]["atensor"]}}


def _verdict(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    def at(mode: str, clients: int) -> dict[str, Any] | None:
        return next((r for r in results.get(mode, []) if r["clients"] == clients), None)
    lines, targets = [], {}
    ours, torch = at("atensor", 32), at("torch", 32)
    if ours and torch and torch["sentences_per_s"] > 0:
        ratio = ours["sentences_per_s"] / max(torch["sentences_per_s"], 1e-9)
        targets["throughput_32_vs_torch"] = ratio
        lines.append(f"throughput at 32 clients: atensor / torch = {ratio:.2f}x (target >= 1)")
    if results.get("atensor"):
        p99 = max(r["health_p99_ms"] for r in results["atensor"])
        targets["atensor_health_p99_ms"] = p99
        targets["atensor_health_worst_ms"] = max(r["health_worst_ms"] for r in results["atensor"])
        lines.append(f"atensor /health p99 under load (worst point): {p99:.1f} ms (target <= 20); worst single "
                     f"probe {targets['atensor_health_worst_ms']:.1f} ms")
    if results.get("sync"):
        targets["sync_health_worst_ms"] = max(r["health_worst_ms"] for r in results["sync"])
        lines.append(f"baseline (a) sync /health worst delay: {targets['sync_health_worst_ms']:.1f} ms")
    if results.get("torch"):
        targets["torch_health_worst_ms"] = max(r["health_worst_ms"] for r in results["torch"])
        lines.append(f"baseline (b) torch /health worst delay: {targets['torch_health_worst_ms']:.1f} ms")
    return {"lines": lines, "targets": targets}


if __name__ == "__main__":
    main()
