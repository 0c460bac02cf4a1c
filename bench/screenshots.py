"""Regenerate the dashboard screenshots in docs/screenshots/ from the demo store.

    .venv/bin/python bench/screenshots.py [--out docs/screenshots] [--chromium /usr/bin/chromium] [--only learning]

What: seeds `memory.testing.seed_demo_store` into a temporary directory, serves the dashboard on a free
localhost port, and has headless Chromium (Playwright) capture each page at 1280 px wide: overview,
learning, episodes, one episode, lessons, lesson-set versions, one OPCD cycle, search (`--only`, which
can repeat, keeps the named ones). Prints a markdown table
of the files and their sizes; fails if a page did not draw its charts or a PNG exceeds 300 KB.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent_runtime.dashboard import create_app
from agent_runtime.dashboard.app import running_server
from memory.testing import seed_demo_store

MAX_BYTES = 300_000
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-gpu",
    "--disable-component-update",
    "--disable-sync",
]


def pages(ids: dict[str, int]) -> list[tuple[str, str, bool]]:
    """(file stem, path, has charts) for each page to capture."""
    return [
        ("overview", f"/?run={ids['run']}", True),
        ("learning", f"/learning?run={ids['run']}", True),
        ("episodes", f"/episodes?run={ids['run']}", False),
        ("episode", f"/episodes/{ids['source_episode']}", True),
        ("lessons", f"/lessons?run={ids['run']}", False),
        ("lesson-versions", f"/lessons/versions?run={ids['run']}", False),
        ("cycle", f"/cycles/{ids['cycle']}", True),
        ("search", "/search?q=frozen+lake+hole", False),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--only", action="append", metavar="STEM", help="capture only this page (repeatable)")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ids = seed_demo_store(tmp)
        with running_server(create_app(tmp)) as base, sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=args.chromium, headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            chosen = [p for p in pages(ids) if not args.only or p[0] in args.only]
            assert chosen, f"--only {args.only} names no page; known: {', '.join(p[0] for p in pages(ids))}"
            for stem, path, charts in chosen:
                page.goto(base + path)
                if charts:
                    page.wait_for_selector(".charts[data-state=drawn] canvas", timeout=10_000)
                target = args.out / f"{stem}.png"
                page.screenshot(path=str(target), full_page=False)
                size = target.stat().st_size
                assert size <= MAX_BYTES, f"{target} is {size} bytes (limit {MAX_BYTES}); shrink the viewport"
                rows.append((stem, path, size))
            browser.close()
    print("| page | path | PNG bytes |\n|---|---|---|")
    for stem, path, size in rows:
        print(f"| {stem} | `{path}` | {size} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
