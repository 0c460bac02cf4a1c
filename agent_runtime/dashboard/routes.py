"""The dashboard's pages and JSON chart endpoints (all GET; every page has a shareable URL).

Pages: `/` overview, `/learning` (is the agent learning: rolling success, cycle evaluations),
`/episodes` (filterable, paged) and `/episodes/{id}` (with the adapter-fingerprint check; its steps
`STEPS_PER_PAGE` at a time, `?page=`, and each text shown up to `SHOWN_CHARS` characters with a link to the whole
stored text: `/episodes/{id}/steps/{index}/observation` (`response`, `action`), `/episodes/{id}/goal` (`error`), so
that an environment that answers with megabytes does not make a page of as many megabytes), `/lessons`,
`/lessons/versions` and `/lessons/{id}` (the lesson's whole life: `lifecycle.py`), `/cycles` and
`/cycles/{id}` (with the adapter probe's verdicts), `/search`.
Fragments for HTMX: a page asked with the `HX-Request` header returns only its changing part
(`/partials/overview` is the overview's live block, polled every few seconds;
`/episodes/{id}/steps/{index}/prompt` is a step's full prompt, loaded when it is opened).
Charts: `/api/runs/{id}/success.json`, `/api/runs/{id}/learning.json` (which also carries the
evaluation matrix and the headline), `/api/episodes/{id}/rewards.json`, `/api/cycles/{id}/curves.json`,
each `{"charts": [...]}` in the shape of `reads.Chart`.

Endpoints are plain `def`s: FastAPI runs them in its thread pool, and the store is safe for
concurrent reads. Query parameters are parsed here (not by FastAPI) so that an empty form field
means "any" and a bad value gets a 400 that names the parameter.
"""

from __future__ import annotations

import functools
import html
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Request
from fastapi.responses import HTMLResponse, JSONResponse

from agent_runtime.dashboard import learning_view, lifecycle, reads
from agent_runtime.dashboard.reads import MAX_INT
from agent_runtime.dashboard.rounds_view import HEIGHT as CURVE_HEIGHT
from agent_runtime.dashboard.rounds_view import WIDTH as CURVE_WIDTH
from agent_runtime.dashboard.rounds_view import continual_view
from memory import LESSON_SET_LIVE, MADE_BY_USER, ExperienceStore, MemoryStoreError, RunInfo
from memory.embeddings import make_embedder
from memory.models import EPISODE_OUTCOMES, LESSON_STATUSES

router = APIRouter()
# Every route answers GET and HEAD (FastAPI's `router.get` would leave HEAD to 405).
get = functools.partial(router.api_route, methods=["GET", "HEAD"])
PER_PAGE = 50
MAX_PER_PAGE = 500
SEARCH_K = 10
WINDOW = 20
MAX_WINDOW = 10_000
STEPS_PER_PAGE = 20
SHOWN_CHARS = 4_000  # of a text block on the episode page (the whole text is on its own page)
SHOWN_ACTIONS = 100  # admissible actions listed per step, each up to SHOWN_ACTION_CHARS
SHOWN_ACTION_CHARS = 200
STEP_TEXTS = ("observation", "response", "action")
EPISODE_TEXTS = ("goal", "error")
# Path parameters in range, or a 400 naming them (app.py's handler), before any query runs.
RowId = Annotated[int, Path(ge=1, le=MAX_INT)]
StepIndex = Annotated[int, Path(ge=0, le=MAX_INT)]


def _store(request: Request) -> ExperienceStore:
    return request.app.state.store


def _int(
    request: Request, name: str, default: int | None = None, *, minimum: int = -MAX_INT - 1, maximum: int = MAX_INT
) -> int | None:
    """An integer query parameter, `default` when absent or empty; 400 when not an integer or out of range."""
    raw = request.query_params.get(name, "").strip()
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise HTTPException(400, f"query parameter {name!r} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise HTTPException(400, f"query parameter {name!r} must be at least {minimum}, got {value}")
    if value > maximum:
        raise HTTPException(400, f"query parameter {name!r} must be at most {maximum}, got {value}")
    return value


def _window(request: Request) -> int:
    """The rolling window of the success charts (`?window=`, episodes)."""
    return _int(request, "window", WINDOW, minimum=1, maximum=MAX_WINDOW) or WINDOW


def _text(request: Request, name: str) -> str | None:
    return request.query_params.get(name, "").strip() or None


def _wants_fragment(request: Request) -> bool:
    """An HTMX swap asks for the changing part only; a history restore needs the whole page."""
    return bool(request.headers.get("hx-request")) and not request.headers.get("hx-history-restore-request")


def _render(request: Request, name: str, context: dict[str, Any]) -> HTMLResponse:
    return request.app.state.templates.TemplateResponse(request, name, context)


def _page(request: Request, name: str, **context: Any) -> HTMLResponse:
    """A full page; every page knows the runs (for the run picker) and the selected run."""
    context.setdefault("runs", _store(request).runs())
    context.setdefault("run_id", None)
    return _render(request, name, context)


def _selected_run(request: Request, runs: list[RunInfo]) -> int | None:
    """The `run` query parameter, defaulting to the newest run."""
    run_id = _int(request, "run", minimum=1)
    if run_id is None:
        return runs[-1].id if runs else None
    if all(r.id != run_id for r in runs):
        raise HTTPException(404, f"no run with id {run_id}; known: {', '.join(str(r.id) for r in runs) or 'none'}")
    return run_id


# -- overview ----------------------------------------------------------------------------------


def _overview_context(request: Request) -> dict[str, Any]:
    store = _store(request)
    runs = store.runs()
    run_id = _selected_run(request, runs)
    counts = reads.run_counts(store)
    lesson_counts = {s: store.count_lessons(run_id, status=s) for s in LESSON_STATUSES} if run_id else {}
    return {
        "runs": runs,
        "run_id": run_id,
        "run": next((r for r in runs if r.id == run_id), None),
        "counts": counts,
        "stats": store.stats(run_id) if run_id is not None else store.stats(),
        "lesson_counts": lesson_counts,
        "cycles": store.cycles(run_id) if run_id is not None else [],
        "active_adapter": store.active_adapter(run_id) if run_id is not None else None,
    }


@get("/", response_class=HTMLResponse)
def overview(request: Request) -> HTMLResponse:
    return _page(request, "overview.html", **_overview_context(request))


@get("/partials/overview", response_class=HTMLResponse)
def overview_live(request: Request) -> HTMLResponse:
    return _render(request, "_overview_live.html", _overview_context(request))


def _known_run(request: Request, run_id: int) -> ExperienceStore:
    """The store, once the path's run id names a run (404 otherwise)."""
    store = _store(request)
    store.get_run(run_id)
    return store


@get("/api/runs/{run_id}/success.json")
def success_json(request: Request, run_id: RowId) -> JSONResponse:
    store = _known_run(request, run_id)
    charts = reads.success_charts(store, run_id, window=_window(request))
    return JSONResponse({"charts": [c.as_json() for c in charts]})


# -- learning ----------------------------------------------------------------------------------


@get("/learning", response_class=HTMLResponse)
def learning(request: Request) -> HTMLResponse:
    store = _store(request)
    runs = store.runs()
    run_id = _selected_run(request, runs)
    window = _window(request)
    matrix = learning_view.evaluation_matrix(store, run_id) if run_id is not None else None
    return _page(
        request,
        "learning.html",
        runs=runs,
        run_id=run_id,
        run=next((r for r in runs if r.id == run_id), None),
        window=window,
        matrix=matrix,
        headline=learning_view.headline(matrix) if matrix else None,
        marks=learning_view.live_marks(store, run_id) if run_id is not None else [],
        continual=continual_view(store, run_id) if run_id is not None else None,
        size=(CURVE_WIDTH, CURVE_HEIGHT),
    )


@get("/api/runs/{run_id}/learning.json")
def learning_json(request: Request, run_id: RowId) -> JSONResponse:
    """The learning page's data: its chart, and the cycles' evaluation matrix and headline."""
    store = _known_run(request, run_id)
    chart = learning_view.learning_chart(store, run_id, window=_window(request))
    matrix = learning_view.evaluation_matrix(store, run_id)
    top = learning_view.headline(matrix)
    return JSONResponse(
        {"charts": [chart.as_json()], "matrix": matrix.as_json(), "headline": top.as_json() if top else None}
    )


# -- episodes ----------------------------------------------------------------------------------


@get("/episodes", response_class=HTMLResponse)
def episodes(request: Request) -> HTMLResponse:
    store = _store(request)
    outcome = _text(request, "outcome")
    if outcome is not None and outcome not in EPISODE_OUTCOMES:
        raise HTTPException(400, f"unknown outcome {outcome!r}; known: {', '.join(EPISODE_OUTCOMES)}")
    where = reads.EpisodeFilter(
        run_id=_int(request, "run"),
        env_id=_text(request, "env"),
        task=_text(request, "task"),
        outcome=outcome,
        adapter_id=_int(request, "adapter"),
        lesson_set_version=_int(request, "lsv"),
    )
    page = _int(request, "page", 1, minimum=1) or 1
    per_page = min(_int(request, "per_page", PER_PAGE, minimum=1) or PER_PAGE, MAX_PER_PAGE)
    rows, total = reads.episode_page(store, where, page=page, per_page=per_page)
    context = {
        "episodes": rows,
        "total": total,
        "page": page,
        "pages": max(1, -(-total // per_page)),
        "where": where,
        "env_ids": reads.env_ids(store),
        "outcomes": EPISODE_OUTCOMES,
        "run_id": where.run_id,
    }
    if _wants_fragment(request):
        return _render(request, "_episode_table.html", context)
    return _page(request, "episodes.html", **context)


@get("/episodes/{episode_id}", response_class=HTMLResponse)
def episode(request: Request, episode_id: RowId) -> HTMLResponse:
    store = _store(request)
    info = reads.episode_head(store, episode_id)
    page = _int(request, "page", 1, minimum=1) or 1
    steps, total = reads.episode_steps(store, episode_id, offset=(page - 1) * STEPS_PER_PAGE, limit=STEPS_PER_PAGE)
    pages = max(1, -(-total // STEPS_PER_PAGE))
    if page > pages:
        raise HTTPException(
            404,
            f"episode {episode_id} has {total} steps on {pages} page(s) of {STEPS_PER_PAGE}; page {page} is past them",
        )
    in_context = store.lessons(ids=info.lessons_in_context) if info.lessons_in_context else []
    return _page(
        request,
        "episode.html",
        episode=info,
        steps=steps,
        page=page,
        pages=pages,
        total_steps=total,
        shown_chars=SHOWN_CHARS,
        shown_actions=SHOWN_ACTIONS,
        shown_action_chars=SHOWN_ACTION_CHARS,
        check=lifecycle.adapter_check(store, info),
        in_context=in_context,
        missing_lessons=sorted(set(info.lessons_in_context) - {lesson.id for lesson in in_context}),
        produced=reads.lessons_from_episode(store, info),
        choices={s.index: reads.choice_distribution(s) for s in steps},
        run_id=info.run_id,
    )


def _step_page(index: int) -> int:
    """The page of the episode page that shows step `index`."""
    return index // STEPS_PER_PAGE + 1


@get("/episodes/{episode_id}/steps/{index}/prompt", response_class=HTMLResponse)
def step_prompt(request: Request, episode_id: RowId, index: StepIndex) -> HTMLResponse:
    """One step's full prompt: an escaped fragment for HTMX (fetched when its <details> opens), else a page."""
    prompt = reads.step_prompt(_store(request), episode_id, index)
    if _wants_fragment(request):
        return HTMLResponse(html.escape(prompt))
    return _page(request, "prompt.html", episode_id=episode_id, index=index, prompt=prompt, page=_step_page(index))


def _step_text_page(name: str) -> Callable[..., HTMLResponse]:
    def page(request: Request, episode_id: RowId, index: StepIndex) -> HTMLResponse:
        text = reads.step_text(_store(request), episode_id, index, name)
        return _page(
            request,
            "text.html",
            title=f"{name.capitalize()} of step {index}",
            back=f"/episodes/{episode_id}?page={_step_page(index)}#step-{index}",
            episode_id=episode_id,
            text=text if text is not None else "(none parsed)",
        )

    page.__name__ = page.__qualname__ = f"step_{name}"
    page.__doc__ = f"One step's {name}, whole (the episode page shows the first SHOWN_CHARS characters)."
    return page


def _episode_text_page(name: str) -> Callable[..., HTMLResponse]:
    def page(request: Request, episode_id: RowId) -> HTMLResponse:
        text = getattr(reads.episode_head(_store(request), episode_id), name)
        return _page(
            request,
            "text.html",
            title=f"{name.capitalize()} of episode {episode_id}",
            back=f"/episodes/{episode_id}",
            episode_id=episode_id,
            text=text if text is not None else "(none)",
        )

    page.__name__ = page.__qualname__ = f"episode_{name}"
    page.__doc__ = f"An episode's {name}, whole (the episode page shows the first SHOWN_CHARS characters)."
    return page


for _name in STEP_TEXTS:
    get(f"/episodes/{{episode_id}}/steps/{{index}}/{_name}", response_class=HTMLResponse)(_step_text_page(_name))
for _name in EPISODE_TEXTS:
    get(f"/episodes/{{episode_id}}/{_name}", response_class=HTMLResponse)(_episode_text_page(_name))


@get("/api/episodes/{episode_id}/rewards.json")
def rewards_json(request: Request, episode_id: RowId) -> JSONResponse:
    store = _store(request)
    reads.episode_head(store, episode_id)  # 404 for an episode that does not exist
    return JSONResponse({"charts": [reads.episode_chart(reads.step_rewards(store, episode_id)).as_json()]})


# -- lessons -----------------------------------------------------------------------------------


@get("/lessons", response_class=HTMLResponse)
def lessons(request: Request) -> HTMLResponse:
    store = _store(request)
    runs = store.runs()
    run_id = _selected_run(request, runs)
    status = _text(request, "status")
    if status is not None and status not in LESSON_STATUSES:
        raise HTTPException(400, f"unknown lesson status {status!r}; known: {', '.join(LESSON_STATUSES)}")
    pool = _int(request, "pool")
    current = store.lesson_set(run_id, status=LESSON_SET_LIVE)  # in context now (not a pending candidate)
    if current is not None:
        members = {lesson.id: lesson for lesson in store.lessons(ids=current.lesson_ids)}
        in_set = [members[i] for i in current.lesson_ids if i in members]
    else:
        in_set = store.lessons(run_id, status="active")
    by_pool: dict[int, list[Any]] = {}
    for lesson in in_set:
        by_pool.setdefault(lesson.pool, []).append(lesson)
    baseline = reads.success_without_lessons(store, run_id) if run_id is not None else None
    page = _int(request, "page", 1, minimum=1) or 1
    per_page = min(_int(request, "per_page", PER_PAGE, minimum=1) or PER_PAGE, MAX_PER_PAGE)
    total = store.count_lessons(run_id, status=status, pool=pool)
    listed = store.lessons(run_id, status=status, pool=pool, limit=per_page, offset=(page - 1) * per_page)
    return _page(
        request,
        "lessons.html",
        runs=runs,
        run_id=run_id,
        current=current,
        by_pool=dict(sorted(by_pool.items())),
        status=status,
        pool=pool,
        statuses=LESSON_STATUSES,
        status_counts={s: store.count_lessons(run_id, status=s) for s in LESSON_STATUSES},
        lessons=listed,
        total=total,
        page=page,
        pages=max(1, -(-total // per_page)),
        baseline=baseline,
        utilities=store.latest_lesson_utilities(run_id, [lesson.id for lesson in listed]),
    )


@get("/lessons/versions", response_class=HTMLResponse)
def lesson_versions(request: Request) -> HTMLResponse:
    store = _store(request)
    runs = store.runs()
    run_id = _selected_run(request, runs)
    diffs = reads.version_diffs(store, run_id)
    mentioned = {i for d in diffs for i in d.added + d.removed}
    texts = {lesson.id: lesson for lesson in store.lessons(ids=mentioned)} if mentioned else {}
    return _page(
        request,
        "versions.html",
        runs=runs,
        run_id=run_id,
        diffs=diffs,
        lessons_by_id=texts,
        gates=reads.gate_decisions(store, run_id),
        by_user=MADE_BY_USER,
    )


@get("/lessons/{lesson_id}", response_class=HTMLResponse)
def lesson(request: Request, lesson_id: RowId) -> HTMLResponse:
    store = _store(request)
    info = store.get_lesson(lesson_id)
    extraction = store.get_extraction(info.extraction_id) if info.extraction_id is not None else None
    return _page(
        request,
        "lesson.html",
        lesson=info,
        extraction=extraction,
        versions=reads.versions_holding(store, lesson_id),
        life=lifecycle.lesson_life(store, info),
        by_user=MADE_BY_USER,
        measured=store.latest_lesson_utilities(info.run_id, [lesson_id]).get(lesson_id),
        run_id=info.run_id,
    )


# -- OPCD cycles -------------------------------------------------------------------------------


@get("/cycles", response_class=HTMLResponse)
def cycles(request: Request) -> HTMLResponse:
    store = _store(request)
    runs = store.runs()
    run_id = _selected_run(request, runs)
    return _page(
        request,
        "cycles.html",
        runs=runs,
        run_id=run_id,
        cycles=store.cycles(run_id),
        adapters=store.adapters(run_id),
    )


@get("/cycles/{cycle_id}", response_class=HTMLResponse)
def cycle(request: Request, cycle_id: RowId) -> HTMLResponse:
    store = _store(request)
    info = store.get_cycle(cycle_id)
    lineage = reads.adapter_lineage(store, info.adapter_id or info.base_adapter_id or 0)
    _, skipped = reads.curve_charts(info.curves)
    return _page(
        request,
        "cycle.html",
        cycle=info,
        evaluations=store.evaluations(cycle_id=cycle_id),
        lineage=lineage,
        consolidated=store.lessons(ids=reads.lessons_consolidated_by(store, cycle_id)),
        skipped_curves=skipped,
        decision=reads.decision(info),
        probe=lifecycle.probe_results(info),
        run_id=info.run_id,
    )


@get("/api/cycles/{cycle_id}/curves.json")
def curves_json(request: Request, cycle_id: RowId) -> JSONResponse:
    charts, _ = reads.curve_charts(_store(request).get_cycle(cycle_id).curves)
    return JSONResponse({"charts": [c.as_json() for c in charts]})


# -- search ------------------------------------------------------------------------------------


def _search_store(request: Request) -> tuple[ExperienceStore | None, str]:
    """A read-only store whose embedder matches the stored vectors, or None and why not."""
    state = request.app.state
    spec = state.embedder
    if spec is None:
        name = reads.stored_embedder(state.store)
        if name is None:
            return None, "no vectors are stored yet; run `agent-runtime memory reindex` on a writable copy"
        spec = reads.embedder_spec(name)
        if spec is None:
            return None, (
                f"the stored vectors were made by embedder {name!r}, which the dashboard cannot "
                "rebuild by itself; pass its spec to create_app(embedder=...)"
            )
    with state.search_lock:
        if spec not in state.search_stores:
            try:  # built here, not at the first search: a stored name can ask for what cannot be built
                embedder = make_embedder(spec)
            except ValueError as exc:
                return None, f"cannot search with the stored vectors' embedder: {exc}"
            state.search_stores[spec] = ExperienceStore.open(state.target, read_only=True, embedder=embedder)
        return state.search_stores[spec], ""


@get("/search", response_class=HTMLResponse)
def search(request: Request) -> HTMLResponse:
    query = _text(request, "q")
    kind = _text(request, "kind") or "all"
    if kind not in ("all", "lessons", "episodes"):
        raise HTTPException(400, f"unknown search kind {kind!r}; known: all, lessons, episodes")
    k = min(_int(request, "k", SEARCH_K, minimum=1) or SEARCH_K, 100)
    lesson_hits: list[Any] = []
    episode_hits: list[Any] = []
    problem = ""
    if query:
        searcher, problem = _search_store(request)
        if searcher is not None:
            try:
                if kind in ("all", "lessons"):
                    lesson_hits = searcher.search_lessons(query, k)
                if kind in ("all", "episodes"):
                    episode_hits = searcher.search_episodes(query, k)
            except MemoryStoreError as exc:
                problem = str(exc)
    context = {
        "q": query or "",
        "kind": kind,
        "lesson_hits": lesson_hits,
        "episode_hits": episode_hits,
        "problem": problem,
    }
    if _wants_fragment(request):
        return _render(request, "_search_results.html", context)
    return _page(request, "search.html", **context)
