"""A text corpus on this machine and a byte-level BPE tokenizer trained on it, cached.

Why: the GPT flagship (examples/train_gpt.py) trains on real text without downloading any. Every
Python installation carries one: its standard library's source, about 1,800 `.py` files and 30 MB
(`sysconfig.get_paths()["stdlib"]`). This module lists those files, splits them into a training and a
held-out set, and trains the tokenizer.

- The split is by a stable hash of each file's path relative to the corpus root (sha256, not Python's
  salted `hash`): the same file is held out on every machine, run and process, and adding a file
  never moves another between the sets.
- The tokenizer is a byte-level BPE (GPT-2's scheme: every byte is a symbol, so any text encodes, and
  decoding gives the text back) trained with the `tokenizers` library on the training files only.
  Training takes ~10 s for the whole stdlib, so it is done once: the tokenizer's JSON is cached under
  `cache_dir` (default ~/.cache/atensor/tokenizers), keyed by a digest of the training files' contents
  and the trainer's settings. A changed file or setting trains a new one.
- `<|endoftext|>` is token 0; it separates documents in the token stream.
"""
from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

EOT = "<|endoftext|>"
TOKENIZER_FORMAT = 1  # part of the cache key: bump when the trainer's settings below change


@dataclass(frozen=True)
class Corpus:
    """Text files under `root`, split into training and held-out files (paths sorted)."""
    root: Path
    train: tuple[Path, ...]
    heldout: tuple[Path, ...]

    def limited(self, train_files: Optional[int] = None, heldout_files: Optional[int] = None) -> Corpus:
        """The first `train_files` training and `heldout_files` held-out files (tests and quick runs)."""
        return Corpus(self.root, self.train[:train_files], self.heldout[:heldout_files])

    def digest(self) -> str:
        """sha256 over the training files' relative paths and contents."""
        h = hashlib.sha256()
        for path in self.train:
            h.update(str(path.relative_to(self.root)).encode() + b"\0")
            h.update(path.read_bytes())
            h.update(b"\0")
        return h.hexdigest()


def stdlib_root() -> Path:
    """The running interpreter's standard library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def python_files(root: Path) -> list[Path]:
    """Every `*.py` file under `root`, sorted, leaving out installed packages (site-packages,
    dist-packages): the standard library's own source."""
    skip = {"site-packages", "dist-packages", "__pycache__"}
    return sorted(p for p in root.rglob("*.py") if p.is_file() and not skip.intersection(p.relative_to(root).parts))


def held_out(relative: str, fraction: float) -> bool:
    """Whether the file at `relative` (a path relative to the corpus root, with '/') is held out: the
    first 8 bytes of its sha256, as a fraction of 2**64, fall below `fraction`."""
    value = int.from_bytes(hashlib.sha256(relative.encode()).digest()[:8], "big")
    return value < fraction * 2 ** 64


def split_corpus(root: Path, files: Sequence[Path], heldout_fraction: float = 0.05) -> Corpus:
    """`files` under `root` split by `held_out` of their relative paths."""
    if not 0 < heldout_fraction < 1:
        raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    train, heldout = [], []
    for path in sorted(files):
        (heldout if held_out(path.relative_to(root).as_posix(), heldout_fraction) else train).append(path)
    if not train or not heldout:
        raise ValueError(f"{len(files)} files under {root} give {len(train)} training and {len(heldout)} "
                         f"held-out files; the corpus needs both")
    return Corpus(root, tuple(train), tuple(heldout))


def stdlib_corpus(heldout_fraction: float = 0.05, root: Optional[Path] = None) -> Corpus:
    """The standard library's source files, split into training and held-out files."""
    root = root or stdlib_root()
    files = python_files(root)
    if not files:
        raise FileNotFoundError(f"no .py files under {root}: the corpus is the Python standard library's "
                                f"source, which this interpreter does not ship")
    return split_corpus(root, files, heldout_fraction)


def read_text(path: Path) -> str:
    """A file's text as UTF-8 (undecodable bytes replaced, so every file reads)."""
    return path.read_text(encoding="utf-8", errors="replace")


def default_cache_dir() -> Path:
    """~/.cache/atensor/tokenizers (or under $XDG_CACHE_HOME)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "atensor" / "tokenizers"


def bpe_tokenizer(corpus: Corpus, vocab_size: int = 4096, cache_dir: Optional[Path] = None) -> Any:
    """A byte-level BPE `tokenizers.Tokenizer` with `vocab_size` tokens trained on the corpus's
    training files, read from the cache when this corpus and these settings trained one before."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise ImportError("the GPT example's tokenizer needs the `tokenizers` package: "
                          "pip install 'atensor[examples]' (or pip install tokenizers)") from None
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 1:
        raise ValueError(f"vocab_size {vocab_size} is below the {len(alphabet)} byte symbols plus {EOT}; "
                         f"use at least {len(alphabet) + 1}")
    key = hashlib.sha256(f"{TOKENIZER_FORMAT}:{vocab_size}:{corpus.digest()}".encode()).hexdigest()[:24]
    cache = (cache_dir or default_cache_dir()) / f"bpe-{vocab_size}-{key}.json"
    if cache.exists():
        return Tokenizer.from_file(str(cache))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], initial_alphabet=alphabet,
                                  show_progress=False)
    tokenizer.train_from_iterator((read_text(p) for p in corpus.train), trainer, length=len(corpus.train))
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_suffix(f".{os.getpid()}.tmp")  # written whole, then renamed: readers never see half
    tokenizer.save(str(partial))
    os.replace(partial, cache)
    return tokenizer
