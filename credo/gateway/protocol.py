"""OpenAI's request and response shapes for the gateway: validation of ``/v1/chat/completions`` and
``/v1/completions`` bodies (every fault a 400 in OpenAI's error format, never an exception out of the server) and
the answers, whole or as stream chunks (docs/bring-your-own.md; credo.gateway.server says what is honoured)."""
from __future__ import annotations

import json
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool",
         "function": "tool"}
MAX_STOP = 4


class GatewayError(Exception):
    """A refused request: its HTTP status and OpenAI error type / code."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "code": self.code, "param": self.param}}

    def line(self) -> str:
        return f"{self.code or self.type}: {self.message}"


def bad(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


@dataclass
class ChatRequest:
    messages: list[dict]  # normalised (parse_messages)
    raw_messages: list[dict]
    tools: list[dict]  # normalised function tools ([] when tool_choice is "none")
    tool_choice: Any
    max_tokens: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    logprobs: bool


@dataclass
class CompletionRequest:
    prompt: str | list[int]
    max_tokens: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    logprobs: bool
    extra: dict = field(default_factory=dict)


def bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name.lower() == b"authorization":
            text = value.decode("latin-1").strip()
            if text[:7].lower() == "bearer ":
                return text[7:].strip()
    return None


def load_body(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad(f"the request body is not valid JSON ({str(exc)[:80]})") from None
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    return body


def _text(content: Any, where: str) -> str:
    """A message content as text: a string, None (""), or a list of text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text") \
                    and isinstance(part.get("text"), str):
                out.append(part["text"])
            elif isinstance(part, dict) and part.get("type") == "refusal":
                continue
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad(f"{where}: only text content is served (got a {kind!r} part)", "messages")
        return "".join(out)
    raise bad(f"{where}: content must be a string, a list of text parts or null", "messages")


def _arguments(raw: Any, where: str) -> Any:
    """A tool call's arguments as an object (a JSON string parsed; a string that is not JSON kept as it is)."""
    if isinstance(raw, dict):
        return raw
    if raw is None:
        return {}
    if not isinstance(raw, str):
        raise bad(f"{where}: function.arguments must be a JSON string", "messages")
    try:
        return json.loads(raw) if raw.strip() else {}
    except ValueError:
        return raw


def parse_messages(messages: Any) -> list[dict]:
    """Normalised messages: ``{"role", "content" (text), "tool_calls": [{"id", "name", "arguments"}],
    "tool_call_id", "name"}``; a tool message's name is looked up from the call it answers when it has none."""
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list", "messages")
    out: list[dict] = []
    names: dict[str, str] = {}
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"{where} must be an object", "messages")
        role = ROLES.get(m.get("role")) if isinstance(m.get("role"), str) else None
        if role is None:
            raise bad(f"{where}: role must be one of {sorted(ROLES)}, got {m.get('role')!r}", "messages")
        msg: dict[str, Any] = {"role": role, "content": _text(m.get("content"), where)}
        if role == "assistant":
            calls = m.get("tool_calls") or []
            if not isinstance(calls, list):
                raise bad(f"{where}: tool_calls must be a list", "messages")
            msg["tool_calls"] = []
            for j, c in enumerate(calls):
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise bad(f"{where}.tool_calls[{j}] needs function.name", "messages")
                cid = c.get("id") if isinstance(c.get("id"), str) else ""
                names[cid] = fn["name"]
                msg["tool_calls"].append({"id": cid, "name": fn["name"],
                                          "arguments": _arguments(fn.get("arguments"), f"{where}.tool_calls[{j}]")})
        if role == "tool":
            cid = m.get("tool_call_id") if isinstance(m.get("tool_call_id"), str) else ""
            msg["tool_call_id"] = cid
            name = m.get("name") if isinstance(m.get("name"), str) else ""
            msg["name"] = name or names.get(cid, "")
        out.append(msg)
    return out


def parse_tools(tools: Any, tool_choice: Any) -> list[dict]:
    """The function tools to render ([] for ``tool_choice: "none"``), normalised to ``{"type": "function",
    "function": {"name", "description", "parameters"}}``."""
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise bad("tools must be a list", "tools")
    out = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}} (only "
                      "function tools are served)", "tools")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise bad(f"tools[{i}].function.parameters must be a JSON schema object", "tools")
        params = {**params, "properties": params.get("properties") or {}}
        out.append({"type": "function", "function": {"name": fn["name"], "description": fn.get("description") or "",
                                                     "parameters": params}})
    names = {t["function"]["name"] for t in out}
    if tool_choice is None or tool_choice in ("auto", "required"):
        return out
    if tool_choice == "none":
        return []
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function" \
            and isinstance(tool_choice.get("function"), dict):
        name = tool_choice["function"].get("name")
        if name not in names:
            raise bad(f"tool_choice names function {name!r}, which is not among the tools", "tool_choice")
        return out
    raise bad('tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
              "tool_choice")


def _common(body: dict) -> tuple[int | None, tuple[str, ...], bool, bool, bool]:
    """(max_tokens, stop, stream, include_usage, logprobs) of a request body, validated."""
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise bad(f"n must be 1 (one completion per call; the collector samples a group as separate episodes), "
                  f"got {n!r}", "n")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise bad(f"max_tokens must be an integer >= 1, got {max_tokens!r}", "max_tokens")
    stop = body.get("stop")
    stop = () if stop is None else (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or len(stop) > MAX_STOP \
            or not all(isinstance(s, str) and s for s in stop):
        raise bad(f"stop must be a non-empty string or a list of at most {MAX_STOP}", "stop")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad("stream must be a boolean", "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise bad("stream_options must be an object", "stream_options")
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, (bool, int)):
        raise bad("logprobs must be a boolean", "logprobs")
    return max_tokens, tuple(stop), stream, bool(opts.get("include_usage")), bool(logprobs)


def parse_chat(body: dict) -> ChatRequest:
    messages = parse_messages(body.get("messages"))
    tools = parse_tools(body.get("tools"), body.get("tool_choice"))
    max_tokens, stop, stream, usage, logprobs = _common(body)
    return ChatRequest(messages, body["messages"], tools, body.get("tool_choice"), max_tokens, stop, stream, usage,
                       logprobs)


def parse_completion(body: dict, vocab_size: int) -> CompletionRequest:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size
                                 for t in prompt):
            raise bad(f"prompt as token ids must be a non-empty list of integers in [0, {vocab_size})", "prompt")
    elif not isinstance(prompt, str) or not prompt:
        raise bad("prompt must be a non-empty string or a list of token ids (one prompt per call)", "prompt")
    if body.get("echo"):
        raise bad("echo is not served", "echo")
    if body.get("suffix"):
        raise bad("suffix is not served", "suffix")
    best_of = body.get("best_of")
    if best_of is not None and best_of != 1:
        raise bad("best_of must be 1", "best_of")
    max_tokens, stop, stream, usage, _ = _common(body)
    logprobs = body.get("logprobs")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int) or logprobs < 0):
        raise bad("logprobs must be an integer >= 0 for /v1/completions", "logprobs")
    return CompletionRequest(prompt, max_tokens, stop, stream, usage, logprobs is not None)


# ------------------------------------------------------------------------------------------------ answers

def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def tool_call_json(name: str, arguments: dict) -> dict:
    return {"id": "call_" + secrets.token_hex(12), "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -9999.0


def chat_logprobs(tokens: list[str], logprobs: list[float]) -> dict:
    return {"content": [{"token": t, "logprob": _finite(lp), "bytes": list(t.encode()), "top_logprobs": []}
                        for t, lp in zip(tokens, logprobs)], "refusal": None}


def chat_answer(cid: str, model: str, content: str | None, tool_calls: list[dict], finish: str, use: dict,
                logprobs: dict | None) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": logprobs}],
            "usage": use, "system_fingerprint": None}


def _pieces(text: str, size: int = 16) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def chat_chunks(cid: str, model: str, content: str | None, tool_calls: list[dict], finish: str, use: dict,
                include_usage: bool) -> list[dict]:
    """The stream chunks of a chat answer (generated whole, then cut): the role, the content in pieces, each
    tool call (id, name, then its arguments), the finish reason, and the usage chunk when asked."""
    created = int(time.time())

    def chunk(delta: dict, finish_reason: str | None = None) -> dict:
        out = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]}
        if include_usage:
            out["usage"] = None
        return out

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": piece}) for piece in _pieces(content or "")]
    for i, call in enumerate(tool_calls):
        fn = call["function"]
        chunks.append(chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                             "function": {"name": fn["name"], "arguments": ""}}]}))
        chunks += [chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
                   for piece in _pieces(fn["arguments"], 32)]
    chunks.append(chunk({}, finish))
    if include_usage:
        chunks.append({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [], "usage": use})
    return chunks


def completion_answer(cid: str, model: str, text: str, finish: str, use: dict, logprobs: dict | None) -> dict:
    return {"id": cid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs}], "usage": use}


def completion_logprobs(tokens: list[str], logprobs: list[float]) -> dict:
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": [_finite(x) for x in logprobs], "top_logprobs": None,
            "text_offset": offsets}


def completion_chunks(cid: str, model: str, text: str, finish: str, use: dict, include_usage: bool) -> list[dict]:
    created = int(time.time())

    def chunk(piece: str, finish_reason: str | None = None) -> dict:
        return {"id": cid, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": piece, "finish_reason": finish_reason, "logprobs": None}]}

    chunks = [chunk(piece) for piece in _pieces(text)] + [chunk("", finish)]
    if include_usage:
        chunks.append({"id": cid, "object": "text_completion", "created": created, "model": model, "choices": [],
                       "usage": use})
    return chunks


def sse(chunks: list[dict]) -> list[bytes]:
    return [b"data: " + json.dumps(c, ensure_ascii=False).encode() + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]
