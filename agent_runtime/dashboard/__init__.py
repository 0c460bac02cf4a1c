"""The dashboard: a read-only web app over the experience memory (`agent-runtime dashboard`).

What it shows: runs and their phase, success over time with OPCD cycle boundaries, whether the agent learns (rolling
success with its 95% interval, when lesson sets and adapters went live, each cycle's evaluation matrix), episodes step
by step, lessons with their provenance and versions, OPCD cycles with curves, evaluations and the promotion decision,
and semantic search. Stack: FastAPI + Jinja2 templates, HTMX for live partial updates and uPlot for charts, both
vendored in `static/` (see VENDOR.md); nothing is fetched from the network. It imports `memory` and nothing else of
ours.

    from agent_runtime.dashboard import create_app, serve
    serve("runs/quickstart")                      # http://127.0.0.1:8765/
    app = create_app("runs/quickstart", token="s3cret")   # an ASGI app, e.g. for tests

Safety rules (read-only store, GET only, escaping, CSP, token, Host check) are in `app.py`.
"""

from agent_runtime.dashboard.app import create_app, serve

__all__ = ["create_app", "serve"]
