"""The chat page of `llmrt serve` (llmrt/static/chat.html) in a real browser: Debian's chromium,
headless, driven by playwright (executable_path: the system's chromium, no downloaded browser).
Load the page, send a message with the keyboard, watch the answer arrive in pieces with the
tokens/s and the cache state shown, stop an answer mid-way, reload (the conversation stays).
Also writes the README's screenshot when LLMRT_SCREENSHOT names a file.

Skips, with the reason, where chromium or playwright is absent (CI installs both).

Run: python -m pytest -q tests/test_webpage.py
"""
import os
import shutil
import time

import pytest

from test_server import Server  # noqa: E402  (starts llmrt serve on a free loopback port)

pytestmark = [pytest.mark.slow, pytest.mark.serve, pytest.mark.browser]

CHROMIUM = os.environ.get("LLMRT_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
WAIT_MS = 120_000


@pytest.fixture(scope="module")
def browser_page(tmp_path_factory):
    required = os.environ.get("LLMRT_REQUIRE_BROWSER") == "1"     # CI: a missing browser fails
    if CHROMIUM is None:
        reason = "chromium is absent (Debian: apt-get install chromium; or set LLMRT_CHROMIUM)"
        if required:
            pytest.fail(reason)
        pytest.skip(reason)
    if required:
        from playwright import sync_api
    else:
        sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is a test extra")
    server = Server(tmp_path_factory.mktemp("web"), "-np", "2", "-c", "256")
    pw = sync_api.sync_playwright().start()
    browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                 args=["--no-sandbox", "--disable-gpu"])
    page = browser.new_page(viewport={"width": 900, "height": 700})
    page.set_default_timeout(WAIT_MS)
    try:
        yield server, page
    finally:
        browser.close()
        pw.stop()
        server.stop()


def _answers(page):
    return page.locator('.msg[data-role="assistant"]')


def _setting(page, field, value):
    """A settings field filled and left with Tab (its change event)."""
    page.fill(field, value)
    page.locator(field).press("Tab")


def _send(page, text):
    """A message typed into the input and sent with Enter."""
    page.focus("#input")
    page.keyboard.type(text)
    page.keyboard.press("Enter")


def test_chat_page_streams_stops_and_reloads(browser_page):
    server, page = browser_page
    page.goto(server.url + "/")
    page.wait_for_function("document.getElementById('model').textContent.endsWith('.gguf')")
    assert page.title() == "llmrt chat"
    # settings: a system prompt and the temperature, with the keyboard
    page.click("summary")
    _setting(page, "#system", "You are a helpful assistant.")
    _setting(page, "#temperature", "0")

    # a message sent with Enter: the answer grows piece by piece
    _send(page, "Write a short poem about the sea.")
    page.wait_for_function("document.body.dataset.state === 'streaming'")
    seen = set()
    t0 = time.monotonic()
    while page.evaluate("document.body.dataset.state") == "streaming" and time.monotonic() - t0 < 120:
        seen.add(len(_answers(page).last.inner_text()))
        time.sleep(0.01)
    assert page.evaluate("document.body.dataset.state") == "idle"
    first = _answers(page).last.inner_text()
    assert len(first) > 20
    assert len([n for n in seen if 0 < n < len(first)]) >= 3        # it arrived in pieces
    assert "tokens/s" in page.inner_text("#status")
    page.wait_for_function("document.getElementById('cache').textContent.includes('cells used')")
    assert "pinned" in page.inner_text("#cache")
    assert page.locator('.msg[data-role="user"]').count() == 1

    # a long answer stopped mid-way with Escape: marked stopped, the slot is free again
    _setting(page, "#max-tokens", "2000")
    _send(page, "Now tell me a very long story about a lighthouse keeper.")
    page.wait_for_function("document.querySelectorAll('.msg[data-role=assistant]')[1]"
                           "?.innerText.length > 40")
    page.keyboard.press("Escape")
    page.wait_for_function("document.body.dataset.state === 'idle'")
    assert "(stopped)" in _answers(page).last.inner_text()
    assert page.inner_text("#status").startswith("stopped after")
    t0 = time.monotonic()
    while server.health()["slots_processing"] and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    assert server.health()["slots_processing"] == 0

    if os.environ.get("LLMRT_SCREENSHOT"):
        page.screenshot(path=os.environ["LLMRT_SCREENSHOT"])

    # reload: the conversation and the settings stay
    page.reload()
    page.wait_for_function("document.querySelectorAll('.msg').length === 4")
    assert _answers(page).first.inner_text() == first
    assert page.input_value("#system") == "You are a helpful assistant."
    # a new chat empties the page (Alt+N)
    page.keyboard.press("Alt+n")
    page.wait_for_function("document.querySelectorAll('.msg').length === 0")


def test_markdown_and_code_blocks_render_safely(browser_page):
    server, page = browser_page
    page.goto(server.url + "/")
    html = page.evaluate("""markdown("# Title\\n\\nSome **bold** and `code`.\\n\\n- one\\n- two\\n\\n"""
                         """```python\\nprint('<b>')\\n```\\n<script>alert(1)</script>")""")
    assert "<h3>Title</h3>" in html and "<strong>bold</strong>" in html and "<code>code</code>" in html
    assert "<ul><li>one</li><li>two</li></ul>" in html
    assert '<pre><code data-lang="python">print(\'&lt;b&gt;\')' in html
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_chat_page_asks_for_the_api_key(browser_page, tmp_path):
    """A server started with --api-key: the page loads (public), its first message is answered
    401, the page asks for the key once, keeps it for the tab, and the answer streams."""
    from test_server import Server
    _, first = browser_page
    server = Server(tmp_path, "--api-key", "page-key", "-np", "1", "-c", "256")
    page = first.context.browser.new_page()
    page.set_default_timeout(WAIT_MS)
    asked = []

    def answer(dialog):
        asked.append(dialog.message)
        dialog.accept("page-key")
    page.on("dialog", answer)
    try:
        page.goto(server.url + "/")
        page.wait_for_function("document.getElementById('model').textContent.endsWith('.gguf')")
        page.evaluate("localStorage.clear()")
        page.click("summary")
        _setting(page, "#max-tokens", "8")
        _send(page, "Hello!")
        page.wait_for_function("document.querySelectorAll('.msg[data-role=assistant]').length === 1 && "
                               "document.body.dataset.state === 'idle'")
        assert asked == ["This server needs an API key:"]
        assert len(_answers(page).last.inner_text()) > 0 and "tokens/s" in page.inner_text("#status")
        assert page.evaluate("sessionStorage.getItem('llmrt-api-key')") == "page-key"
    finally:
        page.close()
        server.stop()
