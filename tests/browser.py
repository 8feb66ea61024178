"""Headless Chromium for the dashboard's browser tests: Debian's `/usr/bin/chromium` driven by Playwright (the PyPI
package; its driver ships in the wheel, no browser is ever downloaded), each test in a fresh profile.

Without the browser the tests skip with the reason, or fail where TILEFARM_REQUIRE_BROWSER=1 (.ci/run installs
chromium and sets it, so CI never passes by skipping). Screenshots go to build/screenshots/ (gitignored), or to
TILEFARM_SCREENSHOTS."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = Path(os.environ.get("TILEFARM_CHROMIUM", "/usr/bin/chromium"))
# headless, and nothing the browser would fetch or start on its own (the test machines reach no outside network)
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1360, "height": 900}
REPO = Path(__file__).resolve().parents[1]


def require_browser() -> None:
    """Skip (or fail, under TILEFARM_REQUIRE_BROWSER=1) when Chromium or Playwright is missing."""
    problem = None
    if not CHROMIUM.is_file():
        problem = f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/run does)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            problem = "the playwright package is missing (pip install -e '.[dev]')"
    if problem:
        if os.environ.get("TILEFARM_REQUIRE_BROWSER") == "1":
            pytest.fail(f"TILEFARM_REQUIRE_BROWSER=1 but {problem}")
        pytest.skip(problem)


def screenshots_dir() -> Path:
    path = Path(os.environ.get("TILEFARM_SCREENSHOTS") or REPO / "build" / "screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def chromium() -> Iterator:
    """A Playwright BrowserContext of a fresh Chromium profile (its user-data-dir deleted afterwards)."""
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="tilefarm-chromium-")
    try:
        with sync_playwright() as p:
            context = p.chromium.launch_persistent_context(
                profile,
                executable_path=str(CHROMIUM),
                headless=True,
                args=CHROMIUM_ARGS,
                viewport=VIEWPORT,
                accept_downloads=True,
            )
            try:
                yield context
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


class Dashboard:
    """A page of the dashboard at `url`, with the steps the tests repeat: log in, open a route, take a screenshot.
    Uncaught exceptions and console errors of the page's scripts are collected in `errors`, for tests to assert
    there are none."""

    def __init__(self, page, url: str):
        self.page, self.url = page, url.rstrip("/")
        self.errors: list[str] = []
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        page.on("console", self._console)

    def _console(self, message) -> None:
        # an HTTP error answer is logged by Chromium itself ("Failed to load resource"): the page shows those
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            self.errors.append(f"console: {message.text}")

    def open(self, route: str = "/jobs") -> None:
        self.page.goto(f"{self.url}/#{route}")

    def route(self, route: str) -> None:
        """Go to a route inside the running page (a hash change, no reload)."""
        self.page.evaluate("r => { location.hash = r; }", f"#{route}")

    def login(self, token: str) -> None:
        self.open("/login")
        self.page.get_by_label("API token").fill(token)
        self.page.get_by_role("button", name="Sign in").click()

    def shot(self, name: str) -> Path:
        path = screenshots_dir() / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path
