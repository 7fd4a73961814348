"""Speculative decoding by prompt lookup: drafts from the request's own text, checked in one forward.

Why prompt lookup: code edits, summaries and extraction repeat long runs of their prompt, and a model
that is about to repeat them can be told the next few tokens by finding the last few generated tokens
earlier in the history (an n-gram match) and proposing what followed them there. No draft model: the
draft costs a scan of the history. The engine then runs the last token and the draft, L = 1 + k
tokens a row, for every generating row in one batched forward (`LlamaEngine.verify_async`), and the
batcher keeps the draft's tokens while they are what greedy decoding picks from the logits before
them, plus the model's own token after the last kept one: 1 to k + 1 tokens per row per step, the
same tokens as one at a time.

A row whose draft was wholly rejected proposes none for the next BACK_OFF steps, so a text that does
not repeat itself (a story) runs mostly plain decode steps, whose one token a row costs less than a
verify of 1 + k.

Only greedy rows without a grammar or log-probabilities speculate (a sampled row's draws are one per
token, a grammar's mask is per position); a step with such rows, or with no draft anywhere, is a plain
decode step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

NGRAM_MAX, NGRAM_MIN = 3, 2  # a 1-token match proposed mostly wrong drafts on stories
BACK_OFF = 4  # steps a row proposes no draft after a draft of which nothing was kept


@dataclass(frozen=True)
class Draft:
    """The tokens proposed to follow a row's history."""
    tokens: tuple[int, ...]


def lookup(history: Sequence[int], k: int, ngram_max: int = NGRAM_MAX, ngram_min: int = NGRAM_MIN) -> Draft:
    """Up to `k` tokens that followed the latest earlier occurrence of the history's last n tokens
    (n from `ngram_max` down to `ngram_min`, the longest match first); empty when none occurs."""
    size = len(history)
    for n in range(min(ngram_max, size - 1), ngram_min - 1, -1):
        tail = list(history[size - n:])
        first = tail[0]
        for start in range(size - n - 1, -1, -1):  # the latest occurrence ending before the tail
            if history[start] == first and list(history[start:start + n]) == tail:
                follow = tuple(history[start + n:start + n + k])
                if follow:
                    return Draft(follow)
    return Draft(())
