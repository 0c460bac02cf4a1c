"""The dashboard in a real browser: Debian's Chromium, headless, driven by Playwright.

A uvicorn server on a free localhost port serves the app over a seeded SQLite store while another
thread keeps writing episodes into the same store (a loop at work). The browser visits every page,
clicks into an episode, a lesson and a cycle, sees the uPlot charts draw (a canvas appears; on the
learning page with its interval band and lesson-set marks, reached from the overview's link), filters
the episode table through HTMX, watches the overview's live counter move, and must never:
- request anything from an address other than localhost (every request is checked and such a one
  aborted and reported),
- hit a Content-Security-Policy violation or a JavaScript error,
- run the `<script>alert(1)</script>` stored in an observation (a dialog would open).
A second test opens the life of a lesson that was consolidated and then forgotten, and an episode whose backend
had other weights loaded than its adapter's (the mismatch flag), under the same rules.

Skipped, with the reason, when /usr/bin/chromium is missing outside CI; in CI (`CI` set) it must run.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from agent_runtime.dashboard import create_app
from agent_runtime.dashboard.app import running_server
from memory import ExperienceStore
from memory.testing import DEMO_ENVS, game_episode

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-gpu",
    "--disable-component-update",
    "--disable-sync",
]
LOCAL_HOSTS = {"127.0.0.1", "localhost"}

if not CHROMIUM.exists() and not os.environ.get("CI"):
    pytest.skip(
        f"{CHROMIUM} not found (apt-get install chromium); the browser test runs in CI", allow_module_level=True
    )


class Writer(threading.Thread):
    """Writes an episode into the store every 50 ms until stopped, like a running loop."""

    def __init__(self, workdir: Path, run_id: int) -> None:
        super().__init__(name="episode-writer", daemon=True)
        self.workdir, self.run_id = workdir, run_id
        self.stop = threading.Event()
        self.written = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with ExperienceStore.open(self.workdir) as store:
                while not self.stop.wait(0.05):
                    record = game_episode(
                        DEMO_ENVS[self.written % 2], f"live-{self.written}", won=True, seed=1000 + self.written
                    )
                    store.add_episode(self.run_id, record, run_state={"live": self.written})
                    self.written += 1
        except Exception as exc:  # noqa: BLE001 -- reported by the test, not swallowed
            self.error = exc


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_dashboard_in_chromium_while_a_loop_writes(tmp_path: Path, seed_with_xss) -> None:
    from playwright.sync_api import expect, sync_playwright

    if not CHROMIUM.exists():
        pytest.fail(f"CI is set but {CHROMIUM} is missing: install the Debian `chromium` package")
    ids = seed_with_xss(tmp_path)
    writer = Writer(tmp_path, ids["run"])
    offsite: list[str] = []
    problems: list[str] = []
    dialogs: list[str] = []
    with running_server(create_app(tmp_path)) as base, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 900})

            def guard(route, request) -> None:
                if urlsplit(request.url).hostname not in LOCAL_HOSTS:
                    offsite.append(request.url)
                    route.abort()
                else:
                    route.continue_()

            context.route("**/*", guard)
            page = context.new_page()
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            writer.start()

            page.goto(f"{base}/?run={ids['run']}")
            expect(page.locator(".charts .chart canvas").first).to_be_visible(timeout=10_000)
            assert page.locator(".charts .chart canvas").count() >= 2
            episodes_card = page.locator("#overview-live .card").nth(1).locator("b")
            shown = int(episodes_card.inner_text())
            expect(episodes_card).not_to_have_text(str(shown), timeout=12_000)  # the 5 s poll saw the writer

            page.locator(f"main a[href='/learning?run={ids['run']}']").click()
            page.wait_for_url(f"{base}/learning?run={ids['run']}")
            chart = page.locator("#learning-chart[data-state=drawn] .chart canvas")
            expect(chart).to_have_count(1, timeout=10_000)
            expect(chart).to_be_visible()
            expect(page.locator("#learning-chart .u-legend")).to_contain_text("95% high")
            expect(page.locator("table.marks .key.lesson_set").first).to_have_text("lessons v1")
            expect(page.locator("table.matrix th", has_text="consolidated adapter, no lessons")).to_have_count(1)
            page.fill("input[name=window]", "5")
            page.press("input[name=window]", "Enter")
            page.wait_for_url(f"{base}/learning?run={ids['run']}&window=5")
            expect(page.locator("#learning-chart[data-state=drawn] .u-title")).to_contain_text(
                "last 5 episodes", timeout=10_000
            )

            page.goto(f"{base}/episodes?run={ids['run']}")
            page.select_option("select[name=outcome]", "won")
            expect(page).to_have_url(
                f"{base}/episodes?run={ids['run']}&env=&task=&outcome=won&adapter=&lsv=", timeout=5_000
            )
            expect(page.locator("#episode-table .badge.lost")).to_have_count(0)
            page.locator("#episode-table tbody a").first.click()
            page.wait_for_url(f"{base}/episodes/*")
            expect(page.locator(".charts .chart canvas")).to_have_count(1, timeout=10_000)

            page.goto(f"{base}/episodes/{ids['xss_episode']}")
            expect(page.locator("pre.obs").first).to_contain_text("<script>alert(1)</script>")
            page.locator("details.prompt summary").first.click()  # HTMX loads the prompt on opening
            expect(page.locator("details.prompt pre").first).to_have_text("prompt <script>alert(1)</script>")
            page.locator(f"a[href='/lessons/{ids['xss_lesson']}']").first.click()
            page.wait_for_url(f"{base}/lessons/{ids['xss_lesson']}")
            expect(page.locator("blockquote.lesson-text")).to_contain_text("<script>alert(1)</script>")

            page.goto(f"{base}/lessons?run={ids['run']}")
            expect(page.locator("h2", has_text="Current set")).to_be_visible()
            page.goto(f"{base}/lessons/versions?run={ids['run']}")
            expect(page.locator("ul.diff li.add").first).to_be_visible()

            page.goto(f"{base}/cycles?run={ids['run']}")
            page.locator(f"a[href='/cycles/{ids['cycle']}']").click()
            page.wait_for_url(f"{base}/cycles/{ids['cycle']}")
            expect(page.locator(".charts .chart canvas")).to_have_count(2, timeout=10_000)

            page.goto(f"{base}/search")
            page.fill("input[name=q]", "frozen lake hole")
            page.press("input[name=q]", "Enter")
            expect(page.locator("#search-results ol.hits a").first).to_be_visible(timeout=10_000)
        finally:
            writer.stop.set()
            writer.join(timeout=10)
            browser.close()
    assert writer.error is None, f"the writer failed while the dashboard read: {writer.error!r}"
    assert writer.written > 10
    assert offsite == [], f"the dashboard requested non-local addresses: {offsite}"
    assert problems == [], f"{len(problems)} console errors (CSP violations?), first: {problems[:3]}"
    assert dialogs == [], "stored text was executed as script"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_forgotten_lessons_life_and_a_mismatched_episode_in_chromium(tmp_path: Path) -> None:
    """The lesson page of a lesson taught into a promoted adapter and then forgotten (the run rolled back), and the
    episode page of an episode whose backend had other weights loaded than its adapter's: shown, not run."""
    from playwright.sync_api import expect, sync_playwright

    from distill.lessons.forget import apply_forget, plan_forget
    from distill.lessons.versions import create_version

    xss = "<script>alert(1)</script>"
    with ExperienceStore.open(tmp_path) as store:
        run = store.create_run("life", {})
        source = store.add_episode(run, game_episode(DEMO_ENVS[0], "t0", won=True, seed=0))
        _, [lesson] = store.record_extraction("x", [f"Take the coin {xss}."], run_id=run, episode_ids=[source])
        cycle = store.start_cycle(run, {}, lesson_set_version=create_version(store, run, [lesson]).version)
        adapter = store.add_adapter("cycle-1", "/adapters/cycle-1", run_id=run, fingerprint="a" * 64)
        store.update_cycle(cycle, adapter_id=adapter)
        store.promote_cycle(cycle, [lesson])
        record = game_episode(DEMO_ENVS[0], f"task {xss}", won=False, seed=1)
        record.adapter_id, record.adapter_fingerprint = adapter, "b" * 64
        episode = store.add_episode(run, record)
        apply_forget(store, plan_forget(store, lesson), count_tokens=lambda text: len(text.split()))
    problems: list[str] = []
    dialogs: list[str] = []
    with running_server(create_app(tmp_path)) as base, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context()
            context.route(
                "**/*",
                lambda route, request: (
                    route.continue_() if urlsplit(request.url).hostname in LOCAL_HOSTS else route.abort()
                ),
            )
            page = context.new_page()
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(f"{base}/lessons/{lesson}")
            expect(page.locator("h1 .badge.forgotten")).to_have_text("forgotten")
            expect(page.locator("blockquote.lesson-text")).to_contain_text(xss)
            expect(page.locator("section.taught tbody tr")).to_have_count(1)
            expect(page.locator("section.forgotten")).to_contain_text("the run went back to the base model")
            expect(page.locator("section.life ol.events li").last).to_contain_text("forgotten")
            page.locator("section.taught a").first.click()
            page.wait_for_url(f"{base}/cycles/{cycle}")
            page.goto(f"{base}/episodes/{episode}")
            expect(page.locator("dd.fingerprint .badge.mismatch")).to_be_visible()
            expect(page.locator("dd.fingerprint")).to_contain_text("bbbbbbbbbbbbbbbb")
        finally:
            browser.close()
    assert problems == [], f"{len(problems)} console errors (CSP violations?), first: {problems[:3]}"
    assert dialogs == [], "stored text was executed as script"
