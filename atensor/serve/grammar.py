"""Constrained decoding: which tokens a request may generate next, as a bitmask over the vocabulary.

Why a token mask from a grammar library: a small model rarely writes valid JSON on its own, and a
schema is a context-free language (objects nest), so validating after the fact and retrying is no
answer. llguidance (the library llama.cpp and vLLM use) keeps a parser state per request and computes,
for each position, the set of tokens that keep the output a prefix of the language: about 9 us a mask
over SmolLM2's 49152 tokens (bench/grammar_libs.py, against 57 us and a 100x longer schema compile for
outlines-core, which also has no grammar for "any JSON object").

How it is used, per decode step: the constrained rows' masks are filled in one call into one (rows,
words) int32 array (`fill`, llguidance's executor, its threads outside the GIL), the rows' logits are
masked at once (`apply`: the bits unpacked to booleans and disallowed logits set to -inf, no Python loop
over the vocabulary), then the batcher samples as usual and tells each row's `Constraint` its token.

Invariant: a Constraint's parser has consumed exactly the tokens its request generated, so its next mask
allows exactly the tokens that keep the output in the grammar (end-of-turn only once it is complete).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from atensor.serve.requests import RequestError

# JSON with up to 16 newlines or spaces between tokens: room for the indented layout the model writes
# (SmolLM2-135M, greedy, json_object: compact JSON only led it into a 90-digit number, the indented form
# into a closed object), and none for a loop of newlines that never closes the object
JSON_OPTIONS = {"whitespace_pattern": r"[\n ]{0,16}"}


def schema_grammar(schema: Any) -> str:
    """llguidance's grammar of the JSON documents `schema` allows (not yet checked: see `Grammars.check`)."""
    import llguidance
    if not isinstance(schema, dict):
        raise RequestError(400, f"a JSON schema must be an object, got {json.dumps(schema)[:200]}",
                           param="response_format", code="invalid_json_schema")
    return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=dict(JSON_OPTIONS))


def lark_grammar(lark: str) -> str:
    """llguidance's grammar of a Lark grammar text (which may embed schemas with `%json {...}`)."""
    import llguidance
    return llguidance.LLMatcher.grammar_from_lark(lark)


class Constraint:
    """One request's parser state: the grammar's matcher, advanced by each generated token, and the
    Grammars it was compiled by (whose executor fills its masks)."""

    def __init__(self, matcher: Any, grammars: "Grammars"):
        self.matcher, self.grammars = matcher, grammars

    def advance(self, token: int) -> None:
        """Consumes the generated `token` (one the last mask allowed)."""
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"the grammar refused token {token}, which its mask allowed: "
                               f"{self.matcher.get_error()}")

    @property
    def done(self) -> bool:
        """The output is complete: the grammar allows no more tokens."""
        return self.matcher.is_stopped()


class Grammars:
    """The server's grammar compiler over its tokenizer's vocabulary (built once: ~0.3-0.8 s), and the
    executor that fills a step's masks together."""

    def __init__(self, tokenizer: Any, threads: Optional[int] = None):
        import llguidance
        self.vocab_size = tokenizer.vocab_size
        self.words = (self.vocab_size + 31) // 32
        self.vocab = llguidance.LLTokenizer(tokenizer.to_json(), n_vocab=self.vocab_size,
                                            eos_token=sorted(tokenizer.end_ids))
        self.executor = llguidance.LLExecutor(threads)

    def check(self, grammar: str, param: str) -> str:
        """`grammar` if llguidance accepts it, else a 400 naming `param` with llguidance's reason."""
        import llguidance
        problem = llguidance.LLMatcher.validate_grammar(grammar, self.vocab)
        if problem:
            raise RequestError(400, f"'{param}': the grammar library refused the schema: {problem}",
                               param=param, code="invalid_json_schema")
        return grammar

    def constraint(self, grammar: str) -> Constraint:
        """A fresh parser state for `grammar` (checked), for one choice."""
        import llguidance
        matcher = llguidance.LLMatcher(self.vocab, grammar, log_level=0)
        if matcher.is_error():
            raise RequestError(400, f"the grammar library refused the schema: {matcher.get_error()}",
                               code="invalid_json_schema")
        return Constraint(matcher, self)


def fill(constraints: Sequence[Constraint]) -> np.ndarray:
    """The next-token bitmasks of `constraints` (of one Grammars), (rows, words) int32, bit j of row i set
    when token j is allowed for row i: computed together, in llguidance's threads, outside the GIL."""
    if not constraints:
        return np.zeros((0, 0), np.int32)
    grammars = constraints[0].grammars
    masks = np.zeros((len(constraints), grammars.words), np.int32)
    grammars.executor.unsafe_compute_mask_ptr([(c.matcher, i) for i, c in enumerate(constraints)],
                                              masks.ctypes.data, grammars.words * 4, len(constraints))
    return masks


def allowed(masks: np.ndarray, vocab_size: int) -> np.ndarray:
    """The bitmasks (rows, words) int32 as booleans (rows, vocab_size) (little-endian words: token j is
    bit j % 32 of word j // 32)."""
    bits = np.unpackbits(np.ascontiguousarray(masks).view(np.uint8), axis=1, bitorder="little")
    return bits[:, :vocab_size].astype(bool)


def apply(logits: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """`logits` (rows, vocab) with every token its row's mask disallows at -inf (a new float32 array)."""
    out = np.array(logits, np.float32)
    out[~allowed(masks, out.shape[1])] = -np.inf
    return out


@dataclass(frozen=True)
class ResponseFormat:
    """A validated `response_format`: the llguidance grammar its outputs follow (None: free text)."""
    grammar: Optional[str]


def response_format(value: Any, grammars: Optional[Grammars]) -> ResponseFormat:
    """OpenAI's `response_format`: {"type": "text"}, {"type": "json_object"} (any JSON object), or
    {"type": "json_schema", "json_schema": {"name", "schema", "strict"}} (documents the schema allows;
    always strict here). A schema the grammar library refuses is a 400 saying why."""
    param = "response_format"
    if value is None:
        return ResponseFormat(None)
    if not isinstance(value, dict) or value.get("type") not in ("text", "json_object", "json_schema"):
        raise RequestError(400, f"'{param}' must be {{\"type\": \"text\" | \"json_object\" | \"json_schema\"}}, "
                                f"got {json.dumps(value)[:200]}", param=param)
    kind = value["type"]
    if kind == "text":
        return ResponseFormat(None)
    if grammars is None:
        raise RequestError(400, f"'{param}' {kind} needs the llguidance package on the server "
                                f"(pip install llguidance)", param=param, code="unsupported_parameter")
    if kind == "json_object":
        return ResponseFormat(grammars.check(schema_grammar({"type": "object"}), param))
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise RequestError(400, f"'{param}' json_schema must be an object with a 'schema' object, got "
                                f"{json.dumps(spec)[:200]}", param=param)
    try:
        grammar = schema_grammar(spec.get("schema", {}))
    except ValueError as exc:
        raise RequestError(400, f"'{param}': {exc}", param=param, code="invalid_json_schema") from None
    return ResponseFormat(grammars.check(grammar, param))
