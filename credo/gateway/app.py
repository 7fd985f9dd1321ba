"""The gateway's HTTP routes (FastAPI): ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``
(credo.gateway.server says what each honours; docs/bring-your-own.md). Imported when a gateway starts (FastAPI
reads the handlers' annotations, so ``Request`` is imported at module level)."""
from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import Request

from credo.gateway import protocol as P
from credo.gateway.capture import CallRecord
from credo.gateway.protocol import GatewayError
from credo.gateway.scheduler import Job

log = logging.getLogger(__name__)


def build_app(gw: Any) -> Any:
    """The FastAPI app of ``gw`` (a credo.gateway.server.Gateway; not imported here: the server imports this)."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    model = {"id": gw.model_name, "object": "model", "created": int(time.time()), "owned_by": "credo"}

    async def answer(request: Request, handler) -> Any:
        key = P.bearer(request.headers.raw)
        try:
            payload, stream = await handler(gw, key, await request.body())
        except GatewayError as exc:
            gw.refuse(key, exc)
            return JSONResponse(exc.body(), status_code=exc.status)
        except Exception as exc:  # noqa: BLE001 - a bug of ours: answered in OpenAI's format, logged
            log.exception("gateway: %s failed", request.url.path)
            error = GatewayError(500, f"internal error: {type(exc).__name__}: {str(exc)[:200]}", type="server_error")
            gw.refuse(key, error)
            return JSONResponse(error.body(), status_code=500)
        if stream:
            return StreamingResponse(iter(P.sse(payload)), media_type="text/event-stream",
                                     headers={"cache-control": "no-cache"})
        return JSONResponse(payload)

    @app.get("/health")
    async def health() -> dict:
        return {"ok": True}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [model]}

    @app.get("/v1/models/{name:path}")
    async def one_model(name: str) -> Any:
        if name != gw.model_name:
            err = GatewayError(404, f"the model {name!r} does not exist (served: {gw.model_name!r})",
                               code="model_not_found")
            return JSONResponse(err.body(), status_code=404)
        return model

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        return await answer(request, chat_completion)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await answer(request, text_completion)

    return app


async def chat_completion(gw: Any, key: str | None, raw: bytes) -> tuple[Any, bool]:
    """(the answer or its stream chunks, whether to stream) of one chat call; records it."""
    t0 = time.monotonic()
    ep = gw.episode(key or "")
    req = P.parse_chat(P.load_body(raw))
    try:
        prompt, reused = gw.renderer.prompt(req.messages, req.tools, ep.memory if gw.append_only else None)
    except Exception as exc:  # noqa: BLE001 - a template that refuses the conversation (e.g. roles out of order)
        raise P.bad(f"the chat template could not render the messages: {type(exc).__name__}: {str(exc)[:200]}",
                    "messages") from None
    cap = gw.admit(ep, len(prompt), req.max_tokens)
    eot = gw.renderer.end_of_turn
    ends = (eot, gw.eos_id)
    call, turn_of = None, None
    try:
        res = await gw.generate(ep, Job(prompt, cap, (eot,), gw.stop_sequences(req.stop)))
        res, text = gw.cut_at_stop(res, req.stop, ends)
        content, calls, parsed_calls = text, [], []
        if req.tools:
            turn = gw.parser.parse(text, {t["function"]["name"]: t["function"]["parameters"] for t in req.tools})
            if turn.calls:
                parsed_calls = turn.calls
                calls = [P.tool_call_json(c.name, c.arguments) for c in turn.calls]
                content = turn.content or None
        finish = "length" if res.finish_reason == "length" else "tool_calls" if calls else "stop"
        call = CallRecord(prompt_ids=prompt, completion_ids=res.ids, logprobs=res.logprobs, finish_reason=finish,
                          text=text, tool_calls=calls, messages=req.raw_messages, endpoint="chat.completions",
                          content=content, tools=req.tools, reused_call=reused, policy_version=res.policy_version,
                          latency_s=time.monotonic() - t0)
        said = {"role": "assistant", "content": content or "",
                "tool_calls": [{"id": j["id"], "name": c.name, "arguments": c.arguments}
                               for j, c in zip(calls, parsed_calls)]}
        turn_of = lambda i: gw.renderer.turn(req.messages, req.tools, said, prompt, res.ids, i)  # noqa: E731
    finally:
        gw.settle(ep, cap, call, turn_of)
    cid, use = P.new_id("chatcmpl"), P.usage(len(prompt), len(res.ids))
    if req.stream:
        return P.chat_chunks(cid, gw.model_name, content, calls, finish, use, req.include_usage), True
    logprobs = P.chat_logprobs(_tokens(gw, res.ids), res.logprobs) if req.logprobs else None
    return P.chat_answer(cid, gw.model_name, content, calls, finish, use, logprobs), False


async def text_completion(gw: Any, key: str | None, raw: bytes) -> tuple[Any, bool]:
    """(the answer or its stream chunks, whether to stream) of one ``/v1/completions`` call; records it."""
    from credo.models.tokenizer import encode_prompt

    t0 = time.monotonic()
    ep = gw.episode(key or "")
    req = P.parse_completion(P.load_body(raw), gw.vocab_size)
    prompt = list(req.prompt) if isinstance(req.prompt, list) else encode_prompt(gw.tokenizer, req.prompt)
    cap = gw.admit(ep, len(prompt), req.max_tokens)
    call = None
    try:
        res = await gw.generate(ep, Job(prompt, cap, (), gw.stop_sequences(req.stop)))
        res, text = gw.cut_at_stop(res, req.stop, (gw.eos_id,))
        call = CallRecord(prompt_ids=prompt, completion_ids=res.ids, logprobs=res.logprobs,
                          finish_reason=res.finish_reason, text=text, endpoint="completions", content=text,
                          policy_version=res.policy_version, latency_s=time.monotonic() - t0)
    finally:
        gw.settle(ep, cap, call)
    cid, use = P.new_id("cmpl"), P.usage(len(prompt), len(res.ids))
    if req.stream:
        return P.completion_chunks(cid, gw.model_name, text, res.finish_reason, use, req.include_usage), True
    logprobs = P.completion_logprobs(_tokens(gw, res.ids), res.logprobs) if req.logprobs else None
    return P.completion_answer(cid, gw.model_name, text, res.finish_reason, use, logprobs), False


def _tokens(gw: Any, ids: list[int]) -> list[str]:
    return [gw.tokenizer.decode([i]) for i in ids]
