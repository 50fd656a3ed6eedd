"""Fixtures of the browser tests: one `streamlit run` server for the whole session, a fresh chromium per test."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from browser import CHROMIUM, CHROMIUM_ARGS, streamlit_server


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The app served by a real Streamlit subprocess on 127.0.0.1, shared by every browser test."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    with streamlit_server(tmp_path_factory.mktemp("server") / "streamlit.log") as url:
        yield url


@pytest.fixture
def browser_page(server: str, tmp_path: Path):
    """A page of a fresh headless chromium (own profile, 1500x1000), opened on the app and settled.
    `browser_page.errors` collects uncaught page errors; `browser_page.requests` every requested URL."""
    from playwright.sync_api import sync_playwright

    from browser import settle

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
            viewport={"width": 1500, "height": 1000})
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.errors, page.requests = [], []
            page.on("pageerror", lambda exc: page.errors.append(str(exc)))
            context.on("request", lambda request: page.requests.append(request.url))
            page.goto(server, timeout=60_000)
            settle(page, 120_000)  # the first run records the default model
            yield page
        finally:
            context.close()
