"""Headless Chromium from Debian for tests, driven over the Chrome DevTools Protocol (aiohttp's websocket client,
already installed with ray[default]): open a page, wait for text, take a screenshot. Loopback only."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

APT_PACKAGES = ["chromium"]
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--mute-audio",
    "--window-size=1600,1000",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]


class BrowserUnavailable(RuntimeError):
    """No Chromium and no way to install it; the message says why and what to do."""


def chromium() -> str:
    """The chromium binary, installed with apt-get when missing (CI runs as root on a fresh machine)."""
    from tests.support.debian import Unavailable, ensure

    try:
        return ensure("chromium", APT_PACKAGES)  # tests/support/debian.py
    except Unavailable as e:
        raise BrowserUnavailable(str(e)) from None


class Page:
    """One tab, spoken to over CDP. Every method is synchronous for the test's sake."""

    def __init__(self, ws_url: str):
        self.loop = asyncio.new_event_loop()
        self.next_id = 0
        self.session, self.ws = self.loop.run_until_complete(self._connect(ws_url))

    async def _connect(self, ws_url: str):
        import aiohttp

        session = aiohttp.ClientSession()
        return session, await session.ws_connect(ws_url, max_msg_size=0)

    async def _call(self, method: str, params: dict, timeout: float) -> dict:
        self.next_id += 1
        mine = self.next_id
        await self.ws.send_json({"id": mine, "method": method, "params": params})

        async def answer() -> dict:
            while True:  # events come in between; the answer carries our id
                msg = json.loads((await self.ws.receive()).data)
                if msg.get("id") == mine:
                    if "error" in msg:
                        raise RuntimeError(f"{method}: {msg['error']}")
                    return msg["result"]

        return await asyncio.wait_for(answer(), timeout)

    def call(self, method: str, timeout: float = 30, **params) -> dict:
        return self.loop.run_until_complete(self._call(method, params, timeout))

    def evaluate(self, expression: str, timeout: float = 30):
        result = self.call("Runtime.evaluate", timeout, expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def text(self) -> str:
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def wait_for_text(self, *needles: str, timeout: float = 60) -> str:
        """The page's text once it holds every needle; fails naming the missing ones and showing the text."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.text()
            missing = [n for n in needles if n not in text]
            if not missing:
                return text
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"not in the page after {timeout:g} s: {missing}\n--- page text ---\n{text[:3000]}"
                )
            time.sleep(0.5)

    def screenshot(self, path: Path) -> None:
        """The whole page, not only the window."""
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 8000), "scale": 1}
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=clip)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        async def shut():
            await self.ws.close()
            await self.session.close()

        with contextlib.suppress(Exception):
            self.loop.run_until_complete(shut())
        self.loop.close()


@contextlib.contextmanager
def headless_chromium() -> Iterator[Page]:
    """A fresh headless Chromium (own profile dir, removed after) and its first tab; stopped by PID."""
    import urllib.request

    binary = chromium()
    profile = tempfile.mkdtemp(prefix="rd-chromium-")
    proc = subprocess.Popen(
        [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    page = None
    try:
        port_file = Path(profile, "DevToolsActivePort")
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None:
                raise BrowserUnavailable(
                    f"chromium exited {proc.returncode}: {proc.stderr.read().decode(errors='replace')[-1500:]}"
                )
            if time.monotonic() > deadline:
                raise BrowserUnavailable("chromium did not open its DevTools port within 60 s")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            tabs = [t for t in json.load(r) if t.get("type") == "page"]
        page = Page(tabs[0]["webSocketDebuggerUrl"])
        page.call("Page.enable")
        yield page
    finally:
        if page is not None:
            page.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the browser and its helper processes only
        proc.wait(timeout=10)
        shutil.rmtree(profile, ignore_errors=True)


def log_in(page: Page, dashboard_url: str, token: str) -> None:
    """What the dashboard's login dialog does with a pasted token: POST it to /api/authenticate, which answers
    with an HttpOnly cookie the web UI then sends with every request."""
    # From a same-origin page that is not the web UI: the UI, loaded before the cookie exists, would open its
    # login dialog and keep it open across the in-page navigation that follows.
    page.goto(dashboard_url + "/api/authentication_mode")
    deadline = time.monotonic() + 30
    while page.evaluate("document.readyState") != "complete" and time.monotonic() < deadline:
        time.sleep(0.2)
    status = page.evaluate(
        f"fetch('/api/authenticate', {{method: 'POST', headers: {{Authorization: 'Bearer {token}'}}}})"
        ".then(r => r.status)"
    )
    if status != 200:
        raise AssertionError(f"the dashboard refused the token: HTTP {status}")
