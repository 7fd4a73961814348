"""Which grammar library the server's constrained decoding uses: llguidance against outlines-core on
SmolLM2's vocabulary (49152 tokens), one JSON schema, one valid document walked token by token.

    python bench/grammar_libs.py     # outlines-core is measured when installed (pip install outlines-core)

Reported per library: building its view of the vocabulary (once per server), compiling the schema (once
per request), and the token mask at each position of the document (every generated token), median and
worst. (xgrammar is the third maintained one; its wheel requires torch, triton and transformers, so it
was not installed next to the CPU torch here.) outlines-core compiles a schema to a regex, so it has no
grammar for `response_format: json_object` (any JSON object: a recursive language) at all.
Results: bench/results/grammar_libs.json.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import machine_facts, table, write_results  # noqa: E402

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}, "email": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city", "zip"], "additionalProperties": False}},
    "required": ["name", "age", "email", "tags", "address"], "additionalProperties": False}
DOCUMENT = json.dumps({"name": "Ada Lovelace", "age": 36, "email": "ada@example.com",
                       "tags": ["math", "engines", "poetry"], "address": {"city": "London", "zip": "W1"}},
                      separators=(",", ":"))


def _walk(ids: list[int], fill, advance, words: int) -> list[float]:
    """Seconds per mask along `ids`, each token checked allowed by the mask before it is consumed."""
    mask = np.zeros((1, words), np.int32)
    times = []
    for token in ids:
        start = time.perf_counter()
        fill(mask)
        times.append(time.perf_counter() - start)
        if not (int(mask[0, token >> 5]) >> (token & 31)) & 1:
            raise AssertionError(f"token {token} of a valid document was masked out")
        advance(token)
    return times


def llguidance_run(tok, ids: list[int]) -> dict:
    import llguidance as llg
    import llguidance.numpy as lnp
    start = time.perf_counter()
    vocab = llg.LLTokenizer(tok._tok.to_str(), n_vocab=tok.vocab_size, eos_token=tok.eos_id)
    built = time.perf_counter() - start
    start = time.perf_counter()
    matcher = llg.LLMatcher(vocab, llg.LLMatcher.grammar_from_json_schema(
        SCHEMA, defaults={"whitespace_flexible": False}))
    compiled = time.perf_counter() - start
    assert not matcher.is_error(), matcher.get_error()
    times = _walk(ids, lambda m: lnp.fill_next_token_bitmask(matcher, m), matcher.consume_token,
                  (tok.vocab_size + 31) // 32)
    return {"library": "llguidance", "version": llg.__version__, "vocabulary_s": built, "compile_s": compiled,
            "mask_us_median": 1e6 * statistics.median(times), "mask_us_max": 1e6 * max(times)}


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character standing for each byte."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
                 + list(range(ord("\xae"), ord("\xff") + 1)))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def outlines_core_run(tok, ids: list[int]) -> dict:
    import outlines_core
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema
    start = time.perf_counter()
    table_: dict[bytes, list[int]] = {}
    alphabet = _byte_level_alphabet()
    for i, token in enumerate(tok.tokens):
        if i not in tok.end_ids and token not in tok.special:
            table_.setdefault(bytes(alphabet[c] for c in token), []).append(i)
    vocab = Vocabulary(tok.eos_id, table_)
    built = time.perf_counter() - start
    start = time.perf_counter()
    guide = Guide(Index(build_regex_from_schema(json.dumps(SCHEMA)), vocab))
    compiled = time.perf_counter() - start
    times = _walk(ids, lambda m: guide.write_mask_into(m.ctypes.data, m.size, m.itemsize), guide.advance,
                  (tok.vocab_size + 31) // 32)
    return {"library": "outlines-core", "version": getattr(outlines_core, "__version__", "?"),
            "vocabulary_s": built, "compile_s": compiled,
            "mask_us_median": 1e6 * statistics.median(times), "mask_us_max": 1e6 * max(times)}


def main() -> None:
    from atensor.models.gguf import load_gguf
    from atensor.models.tokenizer import GGUFTokenizer
    machine = machine_facts()
    tok = GGUFTokenizer(load_gguf().metadata)
    ids = tok.encode(DOCUMENT)
    rows = []
    for run in (llguidance_run, outlines_core_run):
        try:
            rows.append(run(tok, ids))
        except ImportError as exc:
            print(f"{run.__name__}: not installed ({exc})")
    print(table(f"JSON-schema masks over SmolLM2's {tok.vocab_size} tokens, {len(ids)}-token document "
                f"({machine['cpu']}, load {machine['load']})",
                ["library", "vocabulary s", "compile ms", "mask us p50", "mask us max"],
                [[r["library"], r["vocabulary_s"], 1e3 * r["compile_s"], r["mask_us_median"], r["mask_us_max"]]
                 for r in rows]))
    print(write_results("grammar_libs", {"machine_facts": machine, "document_tokens": len(ids), "rows": rows}))


if __name__ == "__main__":
    main()
