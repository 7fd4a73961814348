"""The language-model data pipeline (atensor/nn/data.py) and the corpus and tokenizer (atensor/nn/text.py):
the async pipeline under trio and asyncio gives exactly the synchronous reference's batches, skips to a
start step, keeps a process's rows, never runs more than `prefetch` batches ahead, and stops when closed."""
from __future__ import annotations

import itertools
from pathlib import Path

import anyio
import numpy as np
import pytest

from atensor.nn.data import BatchPipeline, LMDataSpec, Windows, batches_of
from atensor.nn.text import bpe_tokenizer, held_out, python_files, split_corpus, stdlib_corpus

DOCS = [("doc %d " % i) * (3 + i % 7) for i in range(40)]
SPEC = LMDataSpec(batch=4, context=8, seed=3, eot=0, pool_batches=2, chunk_documents=3)


def documents(epoch: int):
    order = np.random.default_rng([1, epoch]).permutation(len(DOCS))
    return (DOCS[i] for i in order)


def encode(texts):  # bytes + 1 as tokens (0 is the end-of-text token)
    return [[b + 1 for b in t.encode()] for t in texts]


def reference(count: int, rows=slice(None)):
    return list(itertools.islice(batches_of(SPEC, documents, encode, rows), count))


def test_windows_overlap_by_one_token_so_every_token_is_a_target_once():
    w = Windows(context=4)
    got = w.feed(np.arange(7)) + w.feed(np.arange(7, 12))
    assert [list(x) for x in got] == [[0, 1, 2, 3, 4], [4, 5, 6, 7, 8]]
    stream = np.concatenate([np.arange(12)])
    targets = np.concatenate([x[1:] for x in got])
    np.testing.assert_array_equal(targets, stream[1:9])


def test_batches_are_targets_shifted_by_one_and_a_pure_function_of_the_seed():
    first, again = reference(6), reference(6)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a.inputs, b.inputs)
    b = first[0]
    assert b.inputs.shape == b.targets.shape == (4, 8) and b.inputs.dtype == np.int32
    np.testing.assert_array_equal(b.inputs[:, 1:], b.targets[:, :-1])
    assert [x.step for x in first] == list(range(6))


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_the_async_pipeline_gives_the_reference_batches_from_the_start_step_with_backpressure(backend):
    want = reference(10, rows=slice(1, 3))
    got, ahead = [], []

    async def main():
        pipeline = BatchPipeline(SPEC, documents, encode, prefetch=2, start_step=3, rows=slice(1, 3))
        async with anyio.create_task_group() as tg:
            tg.start_soon(pipeline.run)
            for _ in range(7):
                await anyio.sleep(0.01)  # a training step: the producer fills the channel meanwhile
                ahead.append(pipeline.stats.batches - len(got))
                got.append(await pipeline.next())
            pipeline.close()
        return pipeline.stats

    stats = anyio.run(main, backend=backend)
    assert [b.step for b in got] == list(range(3, 10))
    for a, b in zip(got, want[3:]):
        np.testing.assert_array_equal(a.inputs, b.inputs)
        np.testing.assert_array_equal(a.targets, b.targets)
        assert a.inputs.shape == (2, 8)
    assert max(ahead) <= 2 + 1  # the channel's 2, and the one the producer holds at its blocked send
    assert stats.documents > 0 and len(stats.waits) == 7


def test_an_epoch_without_documents_is_an_error():
    with pytest.raises(ValueError, match="no documents"):
        next(batches_of(SPEC, lambda epoch: iter(()), encode))


def test_the_split_is_by_a_stable_hash_of_the_relative_path(tmp_path):
    for i in range(60):
        (tmp_path / f"m{i}.py").write_text(f"x = {i}\n")
    corpus = split_corpus(tmp_path, python_files(tmp_path), heldout_fraction=0.2)
    names = {p.name for p in corpus.heldout}
    assert names == {f"m{i}.py" for i in range(60) if held_out(f"m{i}.py", 0.2)}
    assert 3 <= len(names) <= 25 and not names & {p.name for p in corpus.train}


def test_the_stdlib_corpus_and_a_cached_byte_level_tokenizer_that_round_trips(tmp_path):
    corpus = stdlib_corpus().limited(12, 2)
    assert all(p.suffix == ".py" and "site-packages" not in p.parts for p in corpus.train + corpus.heldout)
    tokenizer = bpe_tokenizer(corpus, vocab_size=300, cache_dir=tmp_path)
    cached = list(Path(tmp_path).glob("bpe-300-*.json"))
    assert len(cached) == 1 and tokenizer.get_vocab_size() == 300
    text = "def f(x):\n    return x ** 2  # ünïcode\n"
    again = bpe_tokenizer(corpus, vocab_size=300, cache_dir=tmp_path)  # from the cache
    assert again.encode(text).ids == tokenizer.encode(text).ids
    assert tokenizer.decode(tokenizer.encode(text).ids) == text
    assert tokenizer.token_to_id("<|endoftext|>") == 0
    with pytest.raises(ValueError, match="at least"):
        bpe_tokenizer(corpus, vocab_size=100, cache_dir=tmp_path)
