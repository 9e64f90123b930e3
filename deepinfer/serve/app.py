"""The FastAPI app: OpenAI-compatible endpoints over a `ServeService`.

``POST /v1/completions`` and ``POST /v1/chat/completions`` (``stream`` false or true: Server-Sent
Events ``data:`` chunks ending ``data: [DONE]``), ``GET /v1/models``, ``GET /health`` (503 while
starting or draining), ``GET /metrics`` (Prometheus text). Errors use OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from deepinfer.serve import choices as C
from deepinfer.serve import protocol as P
from deepinfer.serve.errors import APIError, bad_request, server_error
from deepinfer.serve.params import DEFAULT_MAX_TOKENS, build_spec, check_model
from deepinfer.serve.request_stream import Tracked
from deepinfer.serve.service import ServeService


def build_app(service: ServeService, *, manage_service: bool = True) -> FastAPI:
    """The ASGI app. With ``manage_service`` the app's lifespan starts the service and stops
    its replicas at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_service:
            await service.start()
        try:
            yield
        finally:
            if manage_service:
                await service.close()

    app = FastAPI(title="deepinfer serve", lifespan=lifespan)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            err = bad_request(f"the request body is not valid JSON: {first.get('msg', '')}")
        else:
            param = ".".join(loc) or None
            err = bad_request(f"{param or 'body'}: {first.get('msg', 'invalid value')}", param)
        return JSONResponse(err.body(), status_code=400)

    @app.get("/health")
    async def health() -> JSONResponse:
        ok, body = service.health()
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return P.models_body(service.model_name, service.created)

    @app.post("/v1/completions", response_model=None)
    async def completions(req: P.CompletionRequest, request: Request) -> Response:
        check_model(req.model, service.model_name)
        ids = _completion_prompt(service, req.prompt)
        spec = build_spec(req, default_max_tokens=DEFAULT_MAX_TOKENS)
        tracked = service.submit(ids, spec, param="prompt")
        rid = f"cmpl-{uuid.uuid4().hex}"
        model = service.model_name
        with_logprobs = spec.params.logprobs is not None
        if req.stream:
            streamed = C.CompletionChunks(with_logprobs)

            async def chunks() -> AsyncIterator[dict[str, Any]]:
                async for d in service.stream(tracked):
                    if d.error is not None:
                        raise APIError(d.status, d.error, type="server_error")
                    choice = streamed.choice(d)
                    if choice is not None:
                        yield P.completion_chunk(rid, model, [choice])
                    if d.last and spec.include_usage:
                        yield P.completion_chunk(rid, model, [], C.usage(d))

            return _sse(chunks(), tracked)
        done = await _collect(service, tracked, request)
        assert done.final is not None
        choices = done.completion_choices(spec.params.n, with_logprobs)
        body = P.completion_body(rid, model, choices, C.usage(done.final))
        return JSONResponse(body, headers=_headers(tracked))

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(req: P.ChatCompletionRequest, request: Request) -> Response:
        check_model(req.model, service.model_name)
        ids = _chat_prompt(service, req)
        limit = service.max_model_len()
        default = max(1, limit - len(ids)) if limit is not None else DEFAULT_MAX_TOKENS
        spec = build_spec(req, default_max_tokens=default)
        tracked = service.submit(ids, spec, param="messages")
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        model = service.model_name
        top = spec.params.logprobs  # None unless logprobs=true
        if req.stream:

            async def chunks() -> AsyncIterator[dict[str, Any]]:
                yield P.chat_chunk(rid, model, C.chat_role_chunk_choices(spec.params.n))
                async for d in service.stream(tracked):
                    if d.error is not None:
                        raise APIError(d.status, d.error, type="server_error")
                    choice = C.chat_chunk_choice(d, top)
                    if choice is not None:
                        yield P.chat_chunk(rid, model, [choice])
                    if d.last and spec.include_usage:
                        yield P.chat_chunk(rid, model, [], C.usage(d))

            return _sse(chunks(), tracked)
        done = await _collect(service, tracked, request)
        assert done.final is not None
        choices = done.chat_choices(spec.params.n, top)
        body = P.chat_body(rid, model, choices, C.usage(done.final))
        return JSONResponse(body, headers=_headers(tracked))

    return app


# ---------------------------------------------------------------------- helpers
def _completion_prompt(service: ServeService, prompt: Any) -> list[int]:
    assert service.frontend is not None
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
        if len(prompt) != 1:
            raise bad_request("prompt: batches of prompts are not supported; send one", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        return service.frontend.tokenizer.encode(prompt)
    ids = [int(t) for t in prompt]
    vocab = service.frontend.tokenizer.vocab_size
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise bad_request(f"prompt: token ids must be in [0, {vocab}), got {bad[:5]}", "prompt")
    return ids


def _chat_prompt(service: ServeService, req: P.ChatCompletionRequest) -> list[int]:
    assert service.frontend is not None
    messages: list[dict[str, Any]] = []
    for i, m in enumerate(req.messages):
        content = m.content
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise bad_request(
                        "only text content parts are supported", f"messages[{i}].content[{j}]"
                    )
                parts.append(part["text"])
            content = "".join(parts)
        messages.append({"role": m.role, "content": content or ""})
    try:
        return service.frontend.render_chat(messages)
    except ValueError as exc:
        raise bad_request(f"messages: {exc}", "messages") from exc


async def _collect(service: ServeService, tracked: Tracked, request: Request) -> C.Collected:
    """Run a non-streaming request to its end; abort it if the client goes away."""
    done = C.Collected()

    async def run() -> None:
        async for d in service.stream(tracked):
            done.add(d)

    task = asyncio.ensure_future(run())
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=0.25)
            if not task.done() and await request.is_disconnected():
                task.cancel()
                break
        await task
    except asyncio.CancelledError:
        task.cancel()
        raise
    if done.final is None:
        raise server_error("the request ended without an answer")
    if done.final.error is not None:
        raise APIError(done.final.status, done.final.error, type="server_error")
    return done


def _headers(tracked: Tracked) -> dict[str, str]:
    """Which replica served the request (the last one, after a retry)."""
    replica = tracked.replica
    return {"x-deepinfer-replica": str(replica.index)} if replica is not None else {}


def _sse(chunks: AsyncIterator[dict[str, Any]], tracked: Tracked) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in chunks:
                yield f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode()
        except APIError as exc:
            yield f"data: {json.dumps(exc.body())}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream", headers=_headers(tracked))
