"""Decode-step attention over a KV cache: today's window buckets against a symbolic length.

Why: the LLM (atensor/models/llama.py, generation.py) reads the first `window` cells of the cache, the
smallest of WINDOW_BUCKETS (64, 128, ..., 2048) that holds the history, with an additive -inf mask past
the position: one jit program per bucket, each step attending over up to twice the cells it needs. A
symbolic length (`cache[..., :pos+1, :]` with `pos` a bound Variable, graph/view.py) attends over exactly
pos+1 cells with no mask and one program for every position, but its contraction is a C loop nest (BLAS
sizes are ints), where the window's is a gemv.

What is timed: one jitted decode step of `LAYERS` attention layers at SmolLM2-135M's shapes (9 query
heads, 3 KV heads, head dim 64, a 2048-cell cache), batch 1, at several history lengths; process CPU
time per step (time.process_time), the two forms alternating round by round. Both are checked equal to
each other first. Run: `python bench/attention_len.py` (about a minute); writes
bench/results/attention_len.json.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atensor import Tensor, TinyJit, Variable  # noqa: E402
from atensor.models.generation import WINDOW_BUCKETS  # noqa: E402
from bench.common import table, write_results  # noqa: E402

HEADS, KV, HD, CONTEXT, LAYERS = 9, 3, 64, 2048, 4
LENGTHS = (40, 100, 300, 600, 1100, 2000)
ROUNDS, STEPS = 3, 15


def caches() -> list[Tensor]:
    rng = np.random.default_rng(0)
    return [Tensor(rng.standard_normal((1, 2, KV, CONTEXT, HD)).astype(np.float32)).realize()
            for _ in range(LAYERS)]


def attend(q: Tensor, cache: Tensor, length, mask) -> Tensor:
    keys = cache.shrink((None, (0, 1), None, (0, length), None)).reshape(1, KV, length, HD)
    values = cache.shrink((None, (1, 2), None, (0, length), None)).reshape(1, KV, length, HD)
    return q.scaled_dot_product_attention(keys, values, attn_mask=mask, enable_gqa=True)


def window_of(cells: int) -> int:
    return next(w for w in sorted(WINDOW_BUCKETS) + [CONTEXT] if w >= cells)


def main() -> None:
    layers = caches()
    pos_var = Variable("pos", 0, CONTEXT - 1)
    q = Tensor(np.random.default_rng(1).standard_normal((1, HEADS, 1, HD)).astype(np.float32)).realize()

    @TinyJit
    def symbolic_step(q: Tensor, pos) -> Tensor:
        return Tensor.stack(*[attend(q, c, pos + 1, None) for c in layers]).realize()

    window_steps: dict[int, TinyJit] = {}

    def window_step(window: int) -> TinyJit:
        if window not in window_steps:
            @TinyJit
            def step(q: Tensor, mask: Tensor) -> Tensor:
                return Tensor.stack(*[attend(q, c, window, mask) for c in layers]).realize()
            window_steps[window] = step
        return window_steps[window]

    def mask_for(cells: int, window: int) -> Tensor:
        m = np.where(np.arange(window) < cells, 0.0, -np.inf).astype(np.float32)
        return Tensor(m.reshape(1, 1, 1, window))

    def run_symbolic(cells: int) -> np.ndarray:
        return symbolic_step(q, pos_var.bind(cells - 1)).numpy()

    def run_window(cells: int) -> np.ndarray:
        w = window_of(cells)
        return window_step(w)(q, mask_for(cells, w)).numpy()

    for cells in LENGTHS:  # warm: capture each program, and check both forms agree
        for _ in range(3):
            a, b = run_symbolic(cells), run_window(cells)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    times: dict[str, dict[int, list[float]]] = {"symbolic": {}, "window": {}}
    for _ in range(ROUNDS):
        for cells in LENGTHS:
            for name, fn in (("symbolic", run_symbolic), ("window", run_window)):
                start = time.process_time()
                for _ in range(STEPS):
                    fn(cells)
                times[name].setdefault(cells, []).append((time.process_time() - start) / STEPS)
    rows, data = [], []
    for cells in LENGTHS:
        s, w = min(times["symbolic"][cells]), min(times["window"][cells])
        rows.append([cells, window_of(cells), f"{w * 1e3:.3f}", f"{s * 1e3:.3f}", f"{s / w:.2f}",
                     "symbolic" if s < w else "window"])
        data.append({"cells": cells, "window": window_of(cells), "window_ms": w * 1e3, "symbolic_ms": s * 1e3,
                     "symbolic_over_window": s / w})
    print(table(f"decode attention, {LAYERS} layers, batch 1, {HEADS}/{KV} heads x {HD}, CPU ms per step "
                f"(best of {ROUNDS} alternating rounds of {STEPS})",
                ["history", "window", "window ms", "symbolic ms", "symbolic/window", "faster"], rows))
    print(f"captures: symbolic {symbolic_step.stats}, window programs {len(window_steps)}")
    model_rows = llm()
    write_results("attention_len", {"layers": LAYERS, "heads": HEADS, "kv_heads": KV, "head_dim": HD,
                                    "context": CONTEXT, "rows": data,
                                    "symbolic_jit": dict(symbolic_step.stats), "llm": model_rows})


def llm(prompt_tokens: int = 40, new_tokens: int = 560, rounds: int = 2) -> list[dict]:
    """Decode ms per step of the whole model, by window bucket: window engine against symbolic engine."""
    from atensor.models.generation import LlamaEngine
    from atensor.models.gguf import load_gguf
    from atensor.models.llama import Llama
    model = Llama(load_gguf(), slots=1, context=1024)
    engines = {"window": LlamaEngine(model, symbolic_above=None), "symbolic": LlamaEngine(model, symbolic_above=0)}
    ids = list(np.random.default_rng(2).integers(100, 20000, prompt_tokens))
    per: dict[str, dict[int, list[float]]] = {name: {} for name in engines}
    tokens: dict[str, list[int]] = {}
    for _ in range(rounds):
        for name, engine in engines.items():
            logits = engine.prefill(0, ids)
            pos, run, steps = len(ids), [], {}
            for _ in range(new_tokens):
                token = int(np.argmax(logits))
                run.append(token)
                start = time.process_time()
                logits = engine.decode({0: (token, pos)})[0]
                steps.setdefault(engines["window"].window(pos + 1), []).append(time.process_time() - start)
                pos += 1
            tokens[name] = run
            for w, t in steps.items():  # the median step of this round; the best round is kept
                per[name].setdefault(w, []).append(float(np.median(t)))
    assert tokens["window"] == tokens["symbolic"], "the two engines' greedy tokens differ"
    rows, out = [], []
    for w in sorted(per["window"]):
        a, b = min(per["window"][w]), min(per["symbolic"][w])
        rows.append([w, f"{a * 1e3:.2f}", f"{b * 1e3:.2f}", f"{b / a:.2f}", "symbolic" if b < a else "window"])
        out.append({"window": w, "window_ms": a * 1e3, "symbolic_ms": b * 1e3, "symbolic_over_window": b / a})
    print(table(f"SmolLM2-135M decode, batch 1, context 1024, CPU ms per step by window (median step, best of "
                f"{rounds} alternating rounds; greedy tokens equal)",
                ["window", "window ms", "symbolic ms", "symbolic/window", "faster"], rows))
    print(f"decode captures: window {engines['window']._decode_step.stats}, symbolic "
          f"{engines['symbolic']._decode_step.stats}")
    return out


if __name__ == "__main__":
    main()
