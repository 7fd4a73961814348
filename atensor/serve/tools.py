"""Tool calls (OpenAI's `tools` and `tool_choice`) in SmolLM2's function-calling format.

Why this format: SmolLM2's chat template renders roles and contents only; the model learned tool use
from a system prompt listing the tools in `<tools>[...]</tools>` and answers of the form
`<tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>` (the SmolLM2-Instruct model card's
function-calling section). So a request's tools become that system prompt, an assistant turn's
`tool_calls` become that answer text, a tool's result is a turn of role "tool", and the template renders
the rest as usual. The answer is generated under a grammar (atensor.serve.grammar): `required` and a
named function allow only a call whose arguments follow the function's JSON schema; `auto` allows a call
or free text that does not start with "<"; `none` leaves the tools out of the prompt and the output free.

The output is read back into OpenAI's `tool_calls` by one scanner (`ToolCallStream`), fed the text as it
is generated: streaming hands out its deltas (a call's id and name, then its arguments in pieces), a
whole answer feeds everything at once, so both give the same calls and the same argument text.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from atensor.serve.grammar import JSON_OPTIONS
from atensor.serve.requests import RequestError

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
# the system prompt of SmolLM2-Instruct's function calling, with the tools' JSON in place of {tools}
SYSTEM_PROMPT = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. \n"
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose. \n"
    "If none of the functions can be used, point it out and refuse to answer. \n"
    "If the given question lacks the parameters required by the function, also point it out.\n\n"
    "You have access to the following tools:\n<tools>{tools}</tools>\n\n"
    "The output MUST strictly adhere to the following format, and NO other text MUST be included.\n"
    "The example format is as follows. Please make sure the parameter type is correct. If no function call "
    "is needed, please make the tool calls an empty list '[]'.\n"
    "<tool_call>[\n"
    "{{\"name\": \"func_name1\", \"arguments\": {{\"argument1\": \"value1\", \"argument2\": \"value2\"}}}},\n"
    "... (more tool calls as required)\n"
    "]</tool_call>")
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
HEAD = re.compile(r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*$')


@dataclass(frozen=True)
class Tool:
    """One function the model may call: its name, description and parameters' JSON schema."""
    name: str
    description: str
    parameters: dict

    def card(self) -> dict:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


@dataclass(frozen=True)
class ToolUse:
    """A request's validated tools and choice ("none", "auto", "required", or "function" with `name`)."""
    tools: tuple[Tool, ...]
    choice: str
    name: Optional[str] = None

    @property
    def active(self) -> bool:
        """Whether the answer may be tool calls (the tools are in the prompt, the output is parsed)."""
        return self.choice != "none"

    def callable(self) -> tuple[Tool, ...]:
        return tuple(t for t in self.tools if self.choice != "function" or t.name == self.name)

    def grammar(self, parallel: bool = True) -> str:
        """The Lark grammar (llguidance's) of the answers this choice allows (one call at most when
        `parallel` is false, or the choice names a function)."""
        calls = {"anyOf": [{"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                            "required": ["name", "arguments"], "additionalProperties": False}
                           for t in self.callable()]}
        array = {"type": "array", "items": calls, "minItems": 1, "x-guidance": dict(JSON_OPTIONS)}
        if self.choice == "function" or not parallel:
            array["maxItems"] = 1
        rules = [f"calls: {json.dumps(CALL_OPEN)} %json {json.dumps(array)} {json.dumps(CALL_CLOSE)}"]
        if self.choice == "auto":
            return "\n".join(["start: calls | TEXT", *rules, r"TEXT: /[^<](.|\n)*/"])
        return "\n".join(["start: calls", *rules])


def _function(tool: Any, i: int) -> Tool:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(
            tool.get("function"), dict):
        raise RequestError(400, f"'{where}' must be {{\"type\": \"function\", \"function\": {{\"name\", "
                                f"\"description\", \"parameters\"}}}}", param="tools")
    fn = tool["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise RequestError(400, f"'{where}.function.name' must be 1-64 letters, digits, '_' or '-', got "
                                f"{json.dumps(name)}", param="tools")
    parameters = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise RequestError(400, f"'{where}.function.parameters' must be a JSON schema of an object",
                           param="tools")
    description = fn.get("description", "")
    if not isinstance(description, str):
        raise RequestError(400, f"'{where}.function.description' must be a string", param="tools")
    return Tool(name, description, {"type": "object", **parameters})


def tool_use(body: dict) -> Optional[ToolUse]:
    """The request's `tools` and `tool_choice`, validated (None when it sends no tools). A choice naming
    a function that is not among the tools, or asking for calls without tools, is a 400."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise RequestError(400, f"'tool_choice' {json.dumps(choice)} needs 'tools'", param="tool_choice")
        return None
    if not isinstance(tools, list):
        raise RequestError(400, "'tools' must be a list of function tools", param="tools")
    parsed = tuple(_function(t, i) for i, t in enumerate(tools))
    names = [t.name for t in parsed]
    if len(set(names)) != len(names):
        raise RequestError(400, f"'tools' names two functions alike: {names}", param="tools")
    if choice is None:
        return ToolUse(parsed, "auto")
    if choice in ("none", "auto", "required"):
        return ToolUse(parsed, choice)
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise RequestError(400, f"'tool_choice' names the function {json.dumps(name)}, which is not among "
                                    f"the tools ({', '.join(names)})", param="tool_choice")
        return ToolUse(parsed, "function", name)
    raise RequestError(400, f"'tool_choice' must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", "
                            f"\"function\": {{\"name\": ...}}}}, got {json.dumps(choice)[:200]}", param="tool_choice")


def _text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and
                                         isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise RequestError(400, f"'messages[{i}].content' must be a string or a list of text parts",
                       param="messages")


def _calls_text(calls: Any, i: int) -> str:
    """An assistant turn's `tool_calls` as the answer text the model writes for them."""
    if not isinstance(calls, list) or not calls:
        raise RequestError(400, f"'messages[{i}].tool_calls' must be a non-empty list", param="messages")
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(400, f"'messages[{i}].tool_calls' entries need function.name and "
                                    f"function.arguments", param="messages")
        try:
            arguments = json.loads(fn.get("arguments") or "{}")
        except json.JSONDecodeError as exc:
            raise RequestError(400, f"'messages[{i}].tool_calls': the arguments of {fn['name']} are not JSON "
                                    f"({exc})", param="messages") from None
        out.append({"name": fn["name"], "arguments": arguments})
    return CALL_OPEN + json.dumps(out) + CALL_CLOSE


def template_messages(messages: Any, use: Optional[ToolUse]) -> list[dict[str, str]]:
    """The request's messages as the chat template's {role, content} strings: with active tools, their
    system prompt first (before the request's own system message, if any); an assistant turn's
    tool_calls as the call text; a tool's result as a turn of role "tool"."""
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise RequestError(400, "'messages' must be a non-empty list of {role, content} objects", param="messages")
    out = []
    for i, m in enumerate(messages):
        role, content = m["role"], m.get("content")
        if role == "assistant" and m.get("tool_calls"):
            text = (_text(content, i) if content else "") + _calls_text(m["tool_calls"], i)
        elif content is None:
            raise RequestError(400, f"'messages[{i}].content' is missing", param="messages")
        else:
            text = _text(content, i)
        out.append({"role": "tool" if role in ("tool", "function") else role, "content": text})
    if use is not None and use.active:
        prompt = SYSTEM_PROMPT.format(tools=json.dumps([t.card() for t in use.tools]))
        if out[0]["role"] == "system":
            out[0] = {"role": "system", "content": prompt + "\n\n" + out[0]["content"]}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


# ---- reading the answer back -------------------------------------------------------------------------------
@dataclass
class ToolCallDelta:
    """A piece of a tool call: its start (`id` and `name`), or more of its arguments' text."""
    index: int
    id: Optional[str] = None
    name: Optional[str] = None
    arguments: str = ""

    def chunk(self) -> dict:
        """OpenAI's streamed `delta.tool_calls[]` entry."""
        if self.id is not None:
            return {"index": self.index, "id": self.id, "type": "function",
                    "function": {"name": self.name, "arguments": self.arguments}}
        return {"index": self.index, "function": {"arguments": self.arguments}}


@dataclass
class ToolCallStream:
    """Reads a generated answer (fed in pieces) as text or as tool calls: an answer starting with "<" is
    the call form (the grammar allows "<" only there). `feed` returns (content text, [ToolCallDelta]);
    `calls` holds each call's {id, name, arguments} so far."""
    content: str = ""
    calls: list[dict] = field(default_factory=list)
    kind: Optional[str] = None  # "text" or "calls" once the first character is seen
    _seen: str = ""             # the call form's characters read so far
    _depth: int = 0
    _string: bool = False
    _escape: bool = False
    _head: Optional[str] = None  # the current call's text up to its arguments
    _in_args: bool = False

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        if self.kind is None and text:
            self.kind = "calls" if text.startswith("<") else "text"
        if self.kind != "calls":
            self.content += text
            return text, []
        deltas: list[ToolCallDelta] = []
        for ch in text:
            self._char(ch, deltas)
        merged: list[ToolCallDelta] = []
        for d in deltas:  # one delta per call per feed
            if merged and merged[-1].index == d.index and d.id is None:
                merged[-1].arguments += d.arguments
            else:
                merged.append(d)
        return "", merged

    def _char(self, ch: str, deltas: list[ToolCallDelta]) -> None:
        """One character of the call form: `<tool_call>[{"name": "f", "arguments": {...}}, ...]</tool_call>`
        (depth 1 inside the list, 2 inside a call, 3 and more inside its arguments)."""
        self._seen += ch
        if len(self._seen) <= len(CALL_OPEN):
            return
        before = self._depth
        if self._string:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == '"':
                self._string = False
        elif ch == '"':
            self._string = True
        elif ch in "[{":
            self._depth += 1
        elif ch in "]}":
            self._depth -= 1
        if before == 1 and self._depth == 2:  # a call starts
            self._head, self._in_args = "{", False
        elif self._head is not None and not self._in_args:
            head = HEAD.match(self._head)
            if head is not None and not ch.isspace():  # the arguments start with this character
                call = {"id": "call_" + uuid.uuid4().hex[:24], "name": json.loads(head.group(1)), "arguments": ""}
                self.calls.append(call)
                deltas.append(ToolCallDelta(len(self.calls) - 1, call["id"], call["name"]))
                self._in_args = True
            else:
                self._head += ch
        if self._in_args:
            self.calls[-1]["arguments"] += ch
            deltas.append(ToolCallDelta(len(self.calls) - 1, arguments=ch))
            if before == 3 and self._depth == 2:  # the arguments' object closed
                self._head, self._in_args = None, False
