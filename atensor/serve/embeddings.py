"""OpenAI's embeddings protocol (POST /v1/embeddings): the request body in, validated; the reply out.

Why its own module: the embedding server (examples/serve.py) computes vectors its own way (dynamic
batching over model replicas); what OpenAI clients need is only the shape of the exchange. `input` is
a string or a list of strings (token-id inputs are refused: the ids would be the server's tokenizer's,
which a client does not know); `encoding_format` "float" or "base64" (the `openai` Python client asks
for base64 by default: little-endian float32, base64-encoded); `dimensions` only as the model's own.
Errors are OpenAI's shape, naming the field.
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from atensor.serve.requests import RequestError


@dataclass(frozen=True)
class EmbeddingsRequest:
    """A validated /v1/embeddings request."""
    inputs: list[str]
    base64: bool


def parse_embeddings(body: bytes, model_id: str, dim: int, max_inputs: int) -> EmbeddingsRequest:
    """The request, or a RequestError naming what is wrong."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise RequestError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RequestError(400, "the request body must be a JSON object")
    model = data.get("model", model_id)
    if model != model_id:
        raise RequestError(404, f"the model '{model}' does not exist; this server serves '{model_id}'",
                           param="model", code="model_not_found")
    inputs = data.get("input")
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs:
        raise RequestError(400, "'input' must be a string or a non-empty list of strings", param="input")
    if not all(isinstance(s, str) for s in inputs):
        raise RequestError(400, "'input' must hold strings (token-id inputs are not supported here)",
                           param="input")
    if len(inputs) > max_inputs:
        raise RequestError(400, f"'input' has {len(inputs)} strings; at most {max_inputs} per request",
                           param="input")
    fmt = data.get("encoding_format", "float")
    if fmt not in ("float", "base64", None):
        raise RequestError(400, f"'encoding_format' must be 'float' or 'base64', got {json.dumps(fmt)}",
                           param="encoding_format")
    dims = data.get("dimensions")
    if dims is not None and dims != dim:
        raise RequestError(400, f"'dimensions' must be this model's {dim} (it cannot be shortened), got "
                                f"{json.dumps(dims)}", param="dimensions")
    return EmbeddingsRequest(inputs, fmt == "base64")


def embeddings_body(vectors: np.ndarray, model_id: str, prompt_tokens: int, as_base64: bool) -> bytes:
    """OpenAI's reply: {"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
    "model", "usage"}."""
    data: list[dict[str, Any]] = []
    for i, row in enumerate(np.asarray(vectors, np.float32)):
        vector: Any = (base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") if as_base64
                       else row.astype(np.float64).round(8).tolist())
        data.append({"object": "embedding", "index": i, "embedding": vector})
    return json.dumps({"object": "list", "data": data, "model": model_id,
                       "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}).encode()
