"""OpenAI's completions and chat-completions protocol: a request body in, validated; responses and
stream chunks out, in the shapes the `openai` client parses.

Why validate every field OpenAI defines: a client that asks for something the server does not do
(`logit_bias`, `audio`) must learn it, not get a plain completion that looks like an answer. So:
a field this server implements is checked and used; a field OpenAI defines that it does not implement is
a 400 naming it (`UNSUPPORTED`); any other field is ignored, as OpenAI's API ignores fields it does not
know (clients send vendor extensions). A wrong value is a 4xx in OpenAI's error shape naming the field.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Optional

from atensor.models.generation import SamplingParams
from atensor.serve.grammar import Grammars, lark_grammar, response_format
from atensor.serve.requests import RequestError, TokenLogprobs
from atensor.serve.tools import ToolUse, template_messages, tool_use

# fields OpenAI defines that this server does not implement, and the value each may have to be harmless
UNSUPPORTED: dict[str, Any] = {
    "functions": [], "function_call": "none", "logit_bias": {}, "best_of": 1, "echo": False, "suffix": "",
    "audio": None, "modalities": ["text"], "prediction": None, "reasoning_effort": None,
    "web_search_options": None,
}
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs
MAX_LOGPROBS = 5       # completions' integer logprobs


@dataclass(frozen=True)
class Completion:
    """A validated request: what to generate, how, and how to answer."""
    chat: bool
    ids: list[int]
    max_tokens: int
    params: SamplingParams
    stop: list[str]
    stream: bool
    include_usage: bool
    n: int
    logprobs: Optional[int]  # alternatives per token (chat: top_logprobs; completions: the integer)
    ignore_eos: bool
    grammar: Optional[str] = None     # llguidance's grammar every choice's output follows (None: free)
    tools: Optional[ToolUse] = None   # the tools whose calls the output may be (chat)

    @property
    def calls_tools(self) -> bool:
        """Whether the output is read back as tool calls."""
        return self.tools is not None and self.tools.active

    def seeds(self) -> list[int]:
        """The seed of each of the n choices: distinct, reproducible from the request's seed."""
        return [(self.params.seed + i) & (2**64 - 1) for i in range(self.n)]


def _number(body: dict, name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(400, f"'{name}' must be a number, got {json.dumps(value)}", param=name)
    if not lo <= value <= hi:
        raise RequestError(400, f"'{name}' must be in [{lo}, {hi}], got {value}", param=name)
    return float(value)


def _integer(body: dict, name: str, default: Any, lo: int, hi: int) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(400, f"'{name}' must be an integer, got {json.dumps(value)}", param=name)
    if not lo <= value <= hi:
        raise RequestError(400, f"'{name}' must be in [{lo}, {hi}], got {value}", param=name)
    return value


def _flag(body: dict, name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(400, f"'{name}' must be true or false, got {json.dumps(value)}", param=name)
    return value


def _refuse_unsupported(body: dict) -> None:
    for name, harmless in UNSUPPORTED.items():
        if name in body and body[name] is not None and body[name] != harmless:
            raise RequestError(400, f"'{name}' is not supported by this server (it would be ignored, and the "
                                    f"answer would not be what you asked for); leave it out",
                               param=name, code="unsupported_parameter")


def parse(body: Any, chat: bool, tokenizer: Any, context: int, model_id: str, max_n: int,
          default_max_tokens: int = 64, grammars: Optional[Grammars] = None) -> Completion:
    """A validated Completion, or a RequestError saying which field is wrong and how. `grammars`
    compiles `response_format` and `tools` (without it, those are a 400)."""
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    model = body.get("model", model_id)
    if model != model_id:
        raise RequestError(404, f"the model '{model}' does not exist; this server serves '{model_id}'",
                           param="model", code="model_not_found")
    _refuse_unsupported(body)
    fmt = response_format(body.get("response_format"), grammars)
    grammar, tools = fmt.grammar, None
    if chat:
        tools = tool_use(body)
        if tools is not None and tools.active:
            if grammars is None:
                raise RequestError(400, "'tools' need the llguidance package on the server (pip install "
                                        "llguidance)", param="tools", code="unsupported_parameter")
            if grammar is not None:
                raise RequestError(400, "'response_format' and 'tools' both constrain the answer; send one",
                                   param="response_format")
            grammar = grammars.check(lark_grammar(tools.grammar(_flag(body, "parallel_tool_calls", True))),
                                     "tools")
        prompt = tokenizer.render_chat(template_messages(body.get("messages"), tools))
    else:
        for name in ("tools", "tool_choice", "parallel_tool_calls"):
            if body.get(name) not in (None, [], "none"):
                raise RequestError(400, f"'{name}' is for /v1/chat/completions", param=name,
                                   code="unsupported_parameter")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise RequestError(400, "'prompt' is required and must be a non-empty string", param="prompt")
    ids = tokenizer.encode(prompt)
    if len(ids) >= context:
        raise RequestError(400, f"the prompt has {len(ids)} tokens; this server's context is {context} "
                                f"tokens (prompt plus completion)", param="messages" if chat else "prompt",
                           code="context_length_exceeded")
    max_tokens = _integer(body, "max_tokens", default_max_tokens, 1, context - 1)
    if "max_completion_tokens" in body:
        max_tokens = _integer(body, "max_completion_tokens", max_tokens, 1, context - 1)
    asked = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    if body.get(asked) is not None and len(ids) + max_tokens > context:
        raise RequestError(400, f"the prompt has {len(ids)} tokens and '{asked}' asks for {max_tokens} more; "
                                f"this server's context is {context} tokens (prompt plus completion): ask "
                                f"for at most {context - len(ids)}", param=asked, code="context_length_exceeded")
    seed = body.get("seed")
    if seed is None:
        seed = int.from_bytes(uuid.uuid4().bytes[:8], "little")
    elif isinstance(seed, bool) or not isinstance(seed, int):
        raise RequestError(400, f"'seed' must be an integer, got {json.dumps(seed)}", param="seed")
    params = SamplingParams(temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
                            top_k=_integer(body, "top_k", 0, 0, tokenizer.vocab_size),
                            top_p=_number(body, "top_p", 1.0, 0.0, 1.0), seed=seed,
                            frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
                            presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0))
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
        raise RequestError(400, "'stop' must be a string or a list of up to 4 non-empty strings", param="stop")
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError(400, f"'stream_options' must be an object, got {json.dumps(options)}",
                           param="stream_options")
    if options is not None and not stream:
        raise RequestError(400, "'stream_options' is only allowed when 'stream' is true",
                           param="stream_options")
    include_usage = _flag(options or {}, "include_usage")
    n = _integer(body, "n", 1, 1, max_n)
    return Completion(chat, ids, min(max_tokens, context - len(ids)), params, stop, stream, include_usage, n,
                      _logprobs(body, chat), _flag(body, "ignore_eos"), grammar, tools)



def _logprobs(body: dict, chat: bool) -> Optional[int]:
    """Chat: `logprobs` true/false and `top_logprobs` 0..20 (which needs logprobs true); completions:
    `logprobs` an integer 0..5. None: no log-probabilities."""
    if not chat:
        return _integer(body, "logprobs", None, 0, MAX_LOGPROBS)
    wanted = _flag(body, "logprobs")
    top = _integer(body, "top_logprobs", None, 0, MAX_TOP_LOGPROBS)
    if top is not None and not wanted:
        raise RequestError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return (top or 0) if wanted else None


# ---- responses ---------------------------------------------------------------------------------------------
class TokenText:
    """Each token's text and bytes for log-probability reports (cached per token id)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        text = self._cache.get(token)
        if text is None:
            text = self._cache[token] = self.tokenizer.decode([token], skip_special=False)
        return text

    def chat_entry(self, token: int, logprobs: TokenLogprobs) -> dict:
        """One entry of chat's `logprobs.content`."""
        def one(t: int, lp: float) -> dict:
            text = self(t)
            return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}
        entry = one(token, logprobs.logprob)
        entry["top_logprobs"] = [one(t, lp) for t, lp in logprobs.top]
        return entry

    def completion_logprobs(self, tokens: list[int], logprobs: list[TokenLogprobs], offset: int = 0) -> dict:
        """Completions' `logprobs`: tokens, token_logprobs, top_logprobs ({token: logprob}) and
        text_offset, for the choice's `tokens` whose text starts at `offset`."""
        texts = [self(t) for t in tokens]
        offsets = []
        for text in texts:
            offsets.append(offset)
            offset += len(text)
        return {"tokens": texts, "token_logprobs": [lp.logprob for lp in logprobs],
                "top_logprobs": [{self(t): v for t, v in lp.top} for lp in logprobs], "text_offset": offsets}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
