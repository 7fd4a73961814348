"""The tokenizer of a GGUF model, built with `tokenizers` from the file's metadata, and its chat template.

Why here and not a tokenizer.json: the GGUF file carries the vocabulary (`tokenizer.ggml.tokens`), the
BPE merges, each token's type and the chat template, so the model needs no second file. The pipeline is
the one transformers builds from a GGUF file of a GPT-2-style BPE model (its GGUFGPTConverter): byte-level
pre-tokenization (GPT-2's split regex) without a prefix space, byte-level decoding. The hub's
tokenizer.json of SmolLM2 also splits digits one by one first; SmolLM2's vocabulary has single digits
only, so the two differ only in whitespace just before a digit ("\n\n 1"), and the reference here is
transformers loading the same GGUF file; control tokens (type 3,
e.g. `<|im_start|>`) are special, so they are matched whole in text and skipped when decoding with
`skip_special`. The ids are checked against transformers' tokenizer for the model in the tests.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

CONTROL = 3  # gguf TokenType.CONTROL


class GGUFTokenizer:
    """Text <-> token ids for a GGUF BPE model, plus the chat template.

    >>> from atensor.models.gguf import load_gguf
    >>> tok = GGUFTokenizer(load_gguf().metadata)
    >>> tok.encode("The capital of France is")
    [504, 3575, 282, 4649, 314]
    """

    def __init__(self, meta: dict[str, Any]):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
        model = meta.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(f"only GPT-2-style BPE GGUF tokenizers are supported, this one is {model!r}")
        tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
        merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
        vocab = {t: i for i, t in enumerate(tokens)}
        bpe = models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False)
        tok = Tokenizer(bpe)
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(
            add_prefix_space=bool(meta.get("tokenizer.ggml.add_space_prefix", False)), use_regex=True)
        tok.decoder = decoders.ByteLevel()
        types = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
        self.special = [t for t, kind in zip(tokens, types) if kind == CONTROL]
        tok.add_special_tokens(self.special)
        self._tok = tok
        self.tokens = tokens
        self.bos_id: Optional[int] = meta.get("tokenizer.ggml.bos_token_id")
        self.eos_id: int = int(meta.get("tokenizer.ggml.eos_token_id", 0))
        self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
        self.chat_template: Optional[str] = meta.get("tokenizer.chat_template")
        self.end_ids = frozenset({self.eos_id} | {i for i, t in enumerate(tokens)
                                                  if t in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>")})

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (special tokens in the text are matched whole), with BOS when the model adds it."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return ([self.bos_id] + ids) if self.add_bos and self.bos_id is not None else ids

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """Text of `ids`; control tokens are left out when `skip_special`."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special)

    def to_json(self) -> str:
        """The `tokenizers` pipeline as its JSON text (what grammar libraries build their vocabulary from)."""
        return self._tok.to_str()

    def render_chat(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The model's chat template (from the GGUF metadata) applied to `messages`, rendered with jinja2
        in a sandbox, as transformers renders it."""
        if not self.chat_template:
            raise ValueError("this GGUF file has no tokenizer.chat_template; send a raw prompt instead")
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        template = env.from_string(self.chat_template)
        bos = self.tokens[self.bos_id] if self.bos_id is not None else ""
        return template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                               bos_token=bos, eos_token=self.tokens[self.eos_id])
