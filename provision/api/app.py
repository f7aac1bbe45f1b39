"""The FastAPI application: routes, the guard in front of them, and one error shape for everything.

Requests pass the guard first (bearer token, then the body-size limit, both before FastAPI
reads anything), then pydantic validation, then the catalog's rules (E001, E007) — all before
a job exists, so a refused request never starts a VM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from provision import __version__
from provision.api import status
from provision.api.auth import check_bearer
from provision.api.jobs import Event, Job, JobSpec, Runner, iso
from provision.api.schema import ErrorBody, ExecuteRequest, ExecuteResult, Health, StackInfo
from provision.api.settings import Settings
from provision.core import catalog
from provision.core.errors import InvalidValue, ProvisionError, Unauthorized, WrongPlatform

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

NDJSON = "application/x-ndjson"
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {
        400: "invalid body (E003), unknown stack (E001), GPU on a stack without GPU (E007), ...",
        401: "missing or wrong bearer token (E050)",
        408: "the deadline passed (E021); the guest was stopped",
        413: "body or code over the size limit (E003)",
        502: "the guest or its VM failed (E023, E024)",
        503: "no GPU slot before the deadline (E022) or the server is stopping (E026); see Retry-After",
        500: "the server's set-up (E020, ...) or an internal error (E000, no traceback)",
    }.items()
}


def error_response(exc: ProvisionError, http_status: int | None = None) -> JSONResponse:
    code = http_status or status.status_for(exc)
    return JSONResponse(status.body(exc, code), status_code=code, headers=status.headers_for(exc))


class Guard:
    """Raw ASGI in front of the app: the token, then the body limit (read whole, then replayed)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], settings: Settings) -> None:
        self.app, self.settings = app, settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        try:
            check_bearer(headers.get("authorization"), self.settings.token)
        except Unauthorized as exc:
            await error_response(exc)(scope, receive, send)
            return
        limit = self.settings.max_body_bytes
        length = headers.get("content-length", "0")
        too_large = InvalidValue(
            f"request body over the limit of {limit} bytes", fix=f"send at most {limit} bytes (code included)"
        )
        if not length.isdigit():
            await error_response(InvalidValue(f"Content-Length {length[:40]!r} is not a number"))(scope, receive, send)
            return
        if int(length) > limit:
            await error_response(too_large, status.PAYLOAD_TOO_LARGE)(scope, receive, send)
            return
        if scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        held: list[Message] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            size += len(message.get("body", b""))
            if size > limit:
                await error_response(too_large, status.PAYLOAD_TOO_LARGE)(scope, receive, send)
                return
            held.append(message)
            if not message.get("more_body"):
                break

        async def replay() -> Message:
            return held.pop(0) if held else await receive()

        await self.app(scope, replay, send)


def create_app(settings: Settings, runner: Runner) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        # The server is stopping: no VM outlives it.
        await asyncio.to_thread(runner.stop, settings.grace_s + 30)

    app = FastAPI(
        title="krun-gpu execution API",
        version=__version__,
        description="Runs shell code in fresh guests of a stack, with or without the host GPU. See docs/api.md.",
        openapi_url="/openapi.json",
        docs_url=None,  # the interactive pages load scripts from elsewhere; the schema is enough
        redoc_url=None,
        lifespan=lifespan,
    )
    _handlers(app, runner)
    app.add_middleware(Guard, settings=settings)
    _publish_our_error_statuses(app)

    def prepare(req: ExecuteRequest) -> JobSpec:
        """Every rule that can refuse a job, in order, before any VM: E001, E007, E033, E003, E014/E010."""
        stack = catalog.load().get(req.language)
        catalog.check_gpu(stack, req.gpu)
        if "linux" not in stack.hosts:
            raise WrongPlatform(
                f"stack {stack.name!r} runs on {', '.join(stack.hosts)} hosts; this server runs Linux guests",
                fix="GET /api/v1/stacks lists the stacks with runs_here",
            )
        size = len(req.code.encode())
        if size > settings.max_code_bytes:
            raise PayloadTooLarge(
                InvalidValue(
                    f"code of {size} bytes is over the limit of {settings.max_code_bytes}",
                    fix="send a shorter script, or put the work in the stack's image",
                )
            )
        if "\0" in req.code:
            raise InvalidValue("code contains a NUL byte", fix="send shell text without NUL bytes")
        if req.timeout > settings.max_timeout_s:
            raise InvalidValue(f"timeout {req.timeout:g} is over this server's limit of {settings.max_timeout_s} s")
        model_path = model_name = None
        if req.model is not None:  # as the CLI takes it: what was pulled, as typed (models/names.py)
            from provision.models import names, store

            models = store.Store()
            model_name = names.stored(models, req.model)
            model_path = models.path(model_name)
        return JobSpec(stack, req.gpu, req.code, req.timeout, model_path, model_name)

    @app.post("/api/v1/execute", response_model=ExecuteResult, responses=ERRORS)
    async def execute(body: ExecuteRequest, request: Request) -> Response:
        """Run `code` in a fresh guest and answer once it is done."""
        spec = prepare(body)
        loop = asyncio.get_running_loop()
        final: asyncio.Future[Event] = loop.create_future()

        def settle(event: Event) -> None:
            if not final.done():
                final.set_result(event)

        def emit(event: Event) -> None:
            if event["event"] in ("exit", "error"):
                _call_soon(loop, lambda: settle(event))

        job = runner.submit(spec, emit)
        try:
            while not final.done():
                await asyncio.wait({final}, timeout=0.5)
                if not final.done() and await request.is_disconnected():
                    runner.log(f"job {job.id}: client went away, stopping its guest")
                    job.cancel.set()
                    await asyncio.wait({final}, timeout=30)
                    return Response(status_code=499)
        finally:
            if not job.done.is_set():
                job.cancel.set()
        event = final.result()
        if event["event"] == "exit":
            return JSONResponse(event)
        return _job_error(job, event)

    @app.post(
        "/api/v1/execute/stream",
        response_class=StreamingResponse,
        responses={
            200: {
                "description": "NDJSON: accepted, started, stdout/stderr lines, then one exit or error record",
                "content": {NDJSON: {"schema": {"type": "string"}}},
            },
            **ERRORS,
        },
    )
    async def execute_stream(body: ExecuteRequest) -> StreamingResponse:
        """Run `code` in a fresh guest, streaming its output as NDJSON records while it runs."""
        spec = prepare(body)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event] = asyncio.Queue()
        job = runner.submit(spec, lambda event: _call_soon(loop, lambda: queue.put_nowait(event)))

        async def records() -> AsyncIterator[bytes]:
            try:
                yield _line(
                    {
                        "event": "accepted",
                        "job": job.id,
                        "stack": spec.stack.name,
                        "route": spec.route,
                        "gpu": spec.gpu,
                        "timeout": spec.timeout_s,
                        "t": iso(job.accepted_at),
                    }
                )
                while True:
                    event = await queue.get()
                    if event["event"] == "error":
                        response = _job_error(job, event)
                        yield _line({"event": "error", "job": job.id, **json.loads(bytes(response.body))})
                        return
                    yield _line(event)
                    if event["event"] == "exit":
                        return
            finally:
                if not job.done.is_set():  # the client went away (or the server is stopping)
                    runner.log(f"job {job.id}: stream closed early, stopping its guest")
                    job.cancel.set()

        return StreamingResponse(records(), media_type=NDJSON, headers={"Cache-Control": "no-store"})

    @app.get("/api/v1/stacks", response_model=list[StackInfo], responses=ERRORS)
    async def stacks() -> list[StackInfo]:
        """The catalog's stacks; `runs_here` marks those this server can run."""
        return [
            StackInfo(
                name=s.name,
                route=s.route,
                gpu=s.gpu,
                device=s.device,
                hosts=list(s.hosts),
                description=s.description,
                runs_here="linux" in s.hosts,
            )
            for s in catalog.load().stacks.values()
        ]

    @app.get("/api/v1/health", response_model=Health, responses=ERRORS)
    async def health() -> Health:
        counts = runner.counts()
        return Health(
            status="stopping" if runner.draining else "ok",
            running=counts["running"],
            waiting=counts["waiting"],
            max_vms=runner.max_vms,
            gpu_slots=runner.host.gpu_slots(),
            version=__version__,
        )

    return app


class PayloadTooLarge(Exception):
    """An E003 answered with 413: the code is well formed but over the size limit."""

    def __init__(self, error: InvalidValue) -> None:
        super().__init__(error.message)
        self.error = error


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[[], object]) -> None:
    # A closed loop means the server is gone and nobody is listening.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn)


def _line(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, ensure_ascii=False) + "\n").encode()


def _job_error(job: Job, event: Event) -> JSONResponse:
    exc = event.get("error")
    if isinstance(exc, ProvisionError):
        return error_response(exc)
    return JSONResponse(status.internal_body(f"job {job.id}"), status_code=status.INTERNAL)


def _publish_our_error_statuses(app: FastAPI) -> None:
    """FastAPI documents 422 for invalid bodies; this API answers 400 (E003), so the schema says so."""
    make = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = make()
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _handlers(app: FastAPI, runner: Runner) -> None:
    async def provision_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, ProvisionError)
        return error_response(exc)

    async def too_large(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, PayloadTooLarge)
        return error_response(exc.error, status.PAYLOAD_TOO_LARGE)

    async def invalid(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        problems = []
        for err in exc.errors()[:5]:
            loc = [str(p) for p in err.get("loc", ()) if p != "body"]
            if err.get("type") == "json_invalid":
                problems.append(f"the body is not valid JSON (at character {'.'.join(loc) or '?'})")
            else:
                problems.append(f"{'.'.join(loc) or 'body'}: {err.get('msg', 'invalid')}")
        return error_response(
            InvalidValue(
                "invalid request: " + "; ".join(problems),
                fix='send JSON like {"language": "cpu", "code": "echo hi", "timeout": 60} (see /openapi.json)',
            )
        )

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        err = InvalidValue(f"{exc.detail}", fix="see /openapi.json for the endpoints")
        return JSONResponse(status.body(err, exc.status_code), status_code=exc.status_code, headers=exc.headers)

    async def internal(request: Request, exc: Exception) -> Response:
        ref = uuid.uuid4().hex[:12]
        runner.log(f"internal error {ref} on {request.url.path}:\n{''.join(traceback.format_exception(exc))}")
        return JSONResponse(status.internal_body(ref), status_code=status.INTERNAL)

    app.add_exception_handler(ProvisionError, provision_error)
    app.add_exception_handler(PayloadTooLarge, too_large)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, internal)
