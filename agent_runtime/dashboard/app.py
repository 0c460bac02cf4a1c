"""The dashboard's application factory, its safety rules, and `serve`.

What: `create_app(target, token=None)` opens the experience store read-only and returns a FastAPI
app whose pages (see `routes.py`) show runs, episodes, lessons, OPCD cycles and search;
`serve(target, host, port, token)` runs it with uvicorn (what `agent-runtime dashboard` calls);
`running_server(app)` serves an app on a free localhost port in a thread (the browser test and the
screenshot script, over `memory.testing.seed_demo_store`).

Safety, in the order a request meets it (one middleware, so no route can forget a rule):
1. Only GET and HEAD exist: any other method gets 405 before a route runs. The store is also opened
   read-only at the driver (SQLite `mode=ro`, PostgreSQL `default_transaction_read_only`), so even a
   bug in a route cannot write.
2. Without a token, only loopback Host headers are served (127.0.0.1, localhost, ::1): a web page
   that rebinds its own DNS name to 127.0.0.1 cannot read the dashboard through the browser.
3. With a token, every request must carry it: `?token=` once (answered with a redirect that sets an
   HttpOnly SameSite=Strict cookie and drops the token from the URL), the cookie, or
   `Authorization: Bearer <token>`; anything else gets 401.
4. Every response carries `Content-Security-Policy: default-src 'self'` (plus no framing, no base
   or object tags), `X-Content-Type-Options: nosniff` and `Referrer-Policy: no-referrer`. Templates
   autoescape everything, so text from models and environments (which can contain `<script>`) is
   shown, never run; chart data travels as JSON fetched from our own origin.

`serve` binds 127.0.0.1 by default; given a non-loopback host and no token it generates one and
prints the URL that carries it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import jinja2
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException as StarletteHTTPException

from agent_runtime.dashboard.learning_view import condition_label
from agent_runtime.dashboard.reads import MAX_INT, finite
from memory import ExperienceStore, NotFoundError

HERE = Path(__file__).parent
COOKIE = "agent_runtime_dashboard_token"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
CSP = "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'; object-src 'none'"
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
SAFE_METHODS = ("GET", "HEAD")


def is_loopback(host: str) -> bool:
    """True for names and addresses that only this machine can reach."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The host part of a Host header ("[::1]:8765" -> "::1", "localhost:80" -> "localhost")."""
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _format_dt(value: dt.datetime | None) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S") if value else ""


def _pct(value: Any) -> str:
    number = finite(value)
    return "" if number is None else f"{100 * number:.1f}%"


def _pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)


def _query(request: Request, **changes: Any) -> str:
    """The current query string with `changes` applied (None removes a key), for links and pagers."""
    params = {k: v for k, v in request.query_params.items() if v != ""}
    for key, value in changes.items():
        if value is None:
            params.pop(key, None)
        else:
            params[key] = str(value)
    return "?" + urlencode(params) if params else "?"


def _problem(error: dict[str, Any]) -> str:
    """One request-validation error as a sentence: which parameter, what is accepted, what came."""
    where, name, got = error["loc"][0], error["loc"][-1], error.get("input")
    ctx = error.get("ctx") or {}
    if error.get("type") == "int_parsing":
        return f"{where} parameter {name!r} must be an integer, got {got!r}"
    if error.get("type") == "greater_than_equal":
        return f"{where} parameter {name!r} must be between {ctx.get('ge')} and {MAX_INT}, got {got}"
    if error.get("type") == "less_than_equal":
        return f"{where} parameter {name!r} must be at most {ctx.get('le')}, got {got}"
    return f"{'.'.join(map(str, error['loc']))}: {error['msg']}"


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(when=_format_dt, pct=_pct, pretty=_pretty_json, condition=condition_label)
    env.globals.update(query=_query)
    return Jinja2Templates(env=env)


def _local_path(path: str) -> str:
    """`path` as a redirect target that stays on the dashboard: percent-encoded (no backslash, control character
    or space a browser would reinterpret), one leading slash (`//host/x` is another site), no scheme or host."""
    quoted = "/" + quote(path, safe="/:@!$&'()*+,;=-._~").lstrip("/")
    parts = urlsplit(quoted)
    return quoted if not parts.scheme and not parts.netloc else "/"


def _security_middleware(
    token: str | None, allowed_hosts: Sequence[str] | None
) -> Callable[[Request, Callable[[Request], Awaitable[Response]]], Awaitable[Response]]:
    async def guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await _check(request, call_next)
        response.headers.update(SECURITY_HEADERS)
        return response

    async def _check(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.method not in SAFE_METHODS:
            return PlainTextResponse(
                "the dashboard is read-only: only GET and HEAD are allowed",
                status_code=405,
                headers={"Allow": ", ".join(SAFE_METHODS)},
            )
        if allowed_hosts is not None:
            host = _host_name(request.headers.get("host", ""))
            if host not in allowed_hosts:
                return PlainTextResponse(
                    f"unexpected Host {host!r}: without --token the dashboard answers only to "
                    f"{', '.join(allowed_hosts)}",
                    status_code=400,
                )
        if token is None:
            return await call_next(request)
        offered = request.query_params.get("token")
        if offered is not None and secrets.compare_digest(offered.encode(), token.encode()):
            rest = {k: v for k, v in request.query_params.items() if k != "token"}
            target = _local_path(request.url.path) + ("?" + urlencode(rest) if rest else "")
            redirect = RedirectResponse(target, status_code=303)
            redirect.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")
            return redirect
        header = request.headers.get("authorization", "")
        candidates = [request.cookies.get(COOKIE, ""), header.removeprefix("Bearer ").strip()]
        if any(c and secrets.compare_digest(c.encode(), token.encode()) for c in candidates):
            return await call_next(request)
        return PlainTextResponse(
            "this dashboard needs its token: open the URL printed by `agent-runtime dashboard` "
            "(it ends in ?token=...) or send 'Authorization: Bearer <token>'",
            status_code=401,
        )

    return guard


def create_app(
    target: str | os.PathLike[str],
    *,
    token: str | None = None,
    allowed_hosts: Sequence[str] | None = None,
    embedder: str | None = None,
) -> FastAPI:
    """The dashboard app over the store at `target` (a workdir, an SQLite file or a URL), read-only.

    token: required on every request when given (see the module docstring for how it is passed).
    allowed_hosts: Host header names to answer; default loopback names without a token, any with one.
    embedder: a `memory.embeddings.make_embedder` spec for search; default: the one that made the
        stored vectors, when the dashboard knows how to rebuild it (minilm, hash:DIM).
    Raises the store's `MemoryStoreError`s (no database there, not a memory database, outdated).
    """
    from agent_runtime.dashboard.routes import router

    store = ExperienceStore.open(target, read_only=True)
    hosts = allowed_hosts if allowed_hosts is not None else (None if token else LOOPBACK_HOSTS)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        store.close()
        for extra in _app.state.search_stores.values():
            extra.close()

    app = FastAPI(
        title="agent-runtime dashboard",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
    )
    app.state.store = store
    app.state.templates = _templates()
    app.state.target = target
    app.state.embedder = embedder
    app.state.search_stores = {}  # embedder spec -> a read-only store that searches with it
    app.state.search_lock = threading.Lock()
    app.middleware("http")(_security_middleware(token, hosts))
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.include_router(router)

    def error_page(request: Request, status: int, message: str) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"detail": message}, status_code=status)
        return app.state.templates.TemplateResponse(
            request,
            "error.html",
            {"message": message, "status": status, "runs": [], "run_id": None},
            status_code=status,
        )

    @app.exception_handler(NotFoundError)
    async def not_found(request: Request, exc: NotFoundError) -> Response:
        return error_page(request, 404, str(exc))

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> Response:
        # a path parameter that is not an integer ("/episodes/abc") or out of range: 400 naming it, not 422
        return error_page(request, 400, "; ".join(_problem(e) for e in exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return error_page(request, exc.status_code, str(exc.detail))

    return app


def serve(
    target: str | os.PathLike[str],
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
) -> None:
    """Serve the dashboard until Ctrl-C. A non-loopback `host` without a `token` gets a generated
    one; the URL to open (with the token, if any) is printed first."""
    import uvicorn

    if token is None and not is_loopback(host):
        token = secrets.token_urlsafe(24)
    app = create_app(target, token=token)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/" + (f"?token={token}" if token else "")
    print(f"dashboard (read-only) for {app.state.store.url}: {url}", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


@contextmanager
def running_server(app: Any, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve `app` with uvicorn in a background thread on a free port; yields its base URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="dashboard-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the dashboard server did not start within 20 s")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
