"""examples/kv_cache_attention.py against a numpy implementation of the same attention (RoPE, grouped KV
heads, a KV cache): a prompt at position 0 with a causal mask, then one-token decode steps.

With int positions it runs eagerly. Under TinyJit the position is a bound Variable and the cache is read
with `shrink((None, (0, pos + 1), None, None))`: a length that depends on the Variable, a symbolic shape
(graph/view.py); the jitted test checks each step against numpy and that the jit captured once and replayed
the rest."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from atensor import Tensor, TinyJit, Variable

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kv_cache_attention.py"
DIM, HEADS, KV_HEADS, CONTEXT, PROMPT = 32, 4, 2, 16, 3
HEAD_DIM = DIM // HEADS


def load_example():
    spec = importlib.util.spec_from_file_location("kv_cache_attention", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class NumpyAttention:
    """The same attention in float64 numpy, with the example's weights: its own cache, its own RoPE."""

    def __init__(self, attention) -> None:
        self.w = {name: getattr(attention, name).weight.numpy().astype(np.float64)
                  for name in ("wq", "wk", "wv", "wo")}
        inv = 1.0 / 10000.0 ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
        angles = np.arange(CONTEXT)[:, None] * inv[None]
        self.cos, self.sin = np.cos(angles), np.sin(angles)
        self.keys = np.zeros((1, CONTEXT, KV_HEADS, HEAD_DIM))
        self.values = np.zeros((1, CONTEXT, KV_HEADS, HEAD_DIM))

    def rope(self, x: np.ndarray, start: int) -> np.ndarray:
        pairs = x.reshape(*x.shape[:-1], HEAD_DIM // 2, 2)
        cos = self.cos[start:start + x.shape[1]][None, :, None]
        sin = self.sin[start:start + x.shape[1]][None, :, None]
        a, b = pairs[..., 0], pairs[..., 1]
        return np.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(x.shape)

    def __call__(self, x: np.ndarray, start: int) -> np.ndarray:
        n = x.shape[1]
        q = self.rope((x @ self.w["wq"].T).reshape(1, n, HEADS, HEAD_DIM), start)
        k = self.rope((x @ self.w["wk"].T).reshape(1, n, KV_HEADS, HEAD_DIM), start)
        self.keys[:, start:start + n] = k
        self.values[:, start:start + n] = (x @ self.w["wv"].T).reshape(1, n, KV_HEADS, HEAD_DIM)
        rep = HEADS // KV_HEADS  # query head h reads key head h // rep
        keys = np.repeat(self.keys[:, :start + n], rep, axis=2).transpose(0, 2, 1, 3)
        values = np.repeat(self.values[:, :start + n], rep, axis=2).transpose(0, 2, 1, 3)
        scores = q.transpose(0, 2, 1, 3) @ keys.transpose(0, 1, 3, 2) / np.sqrt(HEAD_DIM)
        query_pos = start + np.arange(n)[:, None]
        scores = np.where(np.arange(start + n)[None] <= query_pos, scores, -np.inf)  # causal
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        out = (weights @ values).transpose(0, 2, 1, 3).reshape(1, n, DIM)
        return out @ self.w["wo"].T


def prompt_then_reference():
    """The example's layer and its numpy twin after the same prompt at position 0 (an int position, a causal
    -inf mask); returns them with the decode inputs."""
    example = load_example()
    Tensor.manual_seed(0)
    attention = example.CachedAttention(DIM, HEADS, KV_HEADS, CONTEXT)
    reference = NumpyAttention(attention)
    rng = np.random.default_rng(0)
    prompt = rng.standard_normal((1, PROMPT, DIM)).astype(np.float32)
    mask = Tensor.full((1, 1, PROMPT, PROMPT), float("-inf")).triu(1).realize()
    out = attention(Tensor(prompt), 0, mask)
    np.testing.assert_allclose(out.numpy(), reference(prompt.astype(np.float64), 0), rtol=2e-4, atol=2e-4)
    tokens = rng.standard_normal((6, 1, 1, DIM)).astype(np.float32)
    return attention, reference, tokens


def test_the_layer_matches_numpy_at_int_positions():
    """Prompt, then decode steps at int positions (eager): each step writes its key and value into the
    cache at [pos, pos+1) and attends over [0, pos+1)."""
    attention, reference, tokens = prompt_then_reference()
    for step, token in enumerate(tokens):
        pos = PROMPT + step
        out = attention(Tensor(token), pos)
        np.testing.assert_allclose(out.numpy(), reference(token.astype(np.float64), pos), rtol=2e-4, atol=2e-4)
    cache = attention.cache.numpy()
    np.testing.assert_allclose(cache[0], reference.keys, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(cache[1], reference.values, rtol=1e-5, atol=1e-6)


def test_jitted_decode_at_a_variable_position_matches_numpy_and_replays():
    """TinyJit over the step, the position a bound Variable (1..CONTEXT-1: the write at [pos, pos+1) must
    stay inside the CONTEXT cells), one capture then replays."""
    attention, reference, tokens = prompt_then_reference()
    position = Variable("pos", 1, CONTEXT - 1)

    @TinyJit
    def decode(x: Tensor, pos) -> Tensor:
        return attention(x, pos).realize()

    for step, token in enumerate(tokens):
        pos = PROMPT + step
        out = decode(Tensor(token), position.bind(pos))
        np.testing.assert_allclose(out.numpy(), reference(token.astype(np.float64), pos), rtol=2e-4, atol=2e-4)
    # atensor's jit runs the first call, captures the second, checks the third against it, then replays
    assert decode.stats == {"calls": 6, "replays": 3, "captures": 1}


def test_the_example_runs_as_a_script():
    """`python examples/kv_cache_attention.py`'s main: a prompt, six jitted decode steps, one capture."""
    load_example().main()
