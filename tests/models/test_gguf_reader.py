"""models/gguf.py's reader (`gguf.GGUFReader` over a plain view of its memory map, 2-3x faster on
SmolLM2's header) gives the stock reader's fields and tensors, on a file the gguf package writes."""
from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from atensor.models.gguf import _parsed, _reader_class, read_metadata  # noqa: E402


def _write(path) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "hello", "wörld", "Ġthe", ""])
    writer.add_array("tokenizer.ggml.scores", [0.0, -1.5, -2.25, 3.0, 4.5])
    writer.add_array("tokenizer.ggml.token_type", [3, 1, 1, 1, 1])
    writer.add_string("general.name", "tiny")
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    rng = np.random.default_rng(0)
    writer.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    writer.add_tensor("f16", rng.standard_normal((4, 8)).astype(np.float16))
    q = rng.standard_normal((2, 64)).astype(np.float32)
    writer.add_tensor("q8", gguf.quants.quantize(q, gguf.GGMLQuantizationType.Q8_0),
                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_the_reader_gives_the_stock_readers_fields_and_tensors(tmp_path):
    path = tmp_path / "tiny.gguf"
    _write(path)
    ours, stock = _reader_class()(str(path)), gguf.GGUFReader(str(path))
    # a plain view of the map, not a copy of the file
    assert type(ours.data) is np.ndarray and isinstance(ours.data.base, np.memmap)
    meta = read_metadata(ours)
    assert meta == read_metadata(stock)
    assert meta["tokenizer.ggml.tokens"] == ["<s>", "hello", "wörld", "Ġthe", ""]
    assert [t.name for t in ours.tensors] == [t.name for t in stock.tensors] == ["f32", "f16", "q8"]
    for a, b in zip(ours.tensors, stock.tensors):
        assert a.tensor_type == b.tensor_type and a.shape.tolist() == b.shape.tolist()
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape
        np.testing.assert_array_equal(a.data, b.data)
        np.testing.assert_array_equal(gguf.quants.dequantize(a.data, a.tensor_type),
                                      gguf.quants.dequantize(b.data, b.tensor_type))


def test_a_file_changed_on_disk_is_parsed_again(tmp_path):
    path = tmp_path / "tiny.gguf"
    _write(path)
    stat = path.stat()
    first = _parsed(path, stat.st_size, stat.st_mtime_ns)
    assert _parsed(path, stat.st_size, stat.st_mtime_ns) is first
    assert _parsed(path, stat.st_size, stat.st_mtime_ns + 1) is not first


def test_the_kept_header_reads_the_file_after_its_reader_is_gone(tmp_path):
    """`_parsed` keeps the tensors and metadata, not the reader's per-item fields: the tensors' views
    still read the file's memory map, and the metadata is the stock reader's."""
    path = tmp_path / "kept.gguf"
    _write(path)
    stat = path.stat()
    parsed = _parsed(path, stat.st_size, stat.st_mtime_ns)
    stock = gguf.GGUFReader(str(path))
    assert parsed.metadata == read_metadata(stock)
    assert [t.name for t in parsed.tensors] == [t.name for t in stock.tensors]
    for a, b in zip(parsed.tensors, stock.tensors):
        np.testing.assert_array_equal(a.data, b.data)
