"""A headless Chromium driven over the DevTools protocol, for what a reader's browser shows: that
the site's diagrams render offline (tests/test_docs_render.py) and the Prefect UI's pictures
(docs/screenshots.py).

Chromium is Debian's `chromium-headless-shell` (`make test-tools` installs it as root) or any
`chromium`; `find_chromium()` is None without one. Pages are opened with the network cut off
(`--host-resolver-rules` maps every host to nothing but 127.0.0.1), so a page that still needs a
CDN shows it.
"""
from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from flows.processes import stop_session

CANDIDATES = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")
OFFLINE = "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"   # no name resolves but the loopback address
LISTENING = re.compile(r"DevTools listening on (ws://\S+)")
CLOSE_GRACE_S = 10.0


def find_chromium() -> str | None:
    for name in CANDIDATES:
        found = shutil.which(name) or (f"/usr/lib/chromium/{name}" if Path(f"/usr/lib/chromium/{name}").exists() else None)
        if found:
            return found
    return None


class Browser:
    """One headless Chromium with one page; `open`, `evaluate` and `screenshot` drive it."""

    def __init__(self, executable: str, width: int = 1280, height: int = 800, timeout_s: float = 60.0):
        self._profile = tempfile.TemporaryDirectory(prefix="pforge-chromium-")
        self._process = subprocess.Popen(
            [executable, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-port=0",
             f"--user-data-dir={self._profile.name}", f"--window-size={width},{height}",
             f"--host-resolver-rules={OFFLINE}", "--allow-file-access-from-files", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            start_new_session=True)   # Debian's wrapper script starts Chromium as its child: `close` stops them all
        self.timeout_s = timeout_s
        self._browser_url = self._wait_for_devtools()
        self._loop = asyncio.new_event_loop()
        self._socket = self._loop.run_until_complete(self._connect_page())
        self._ids = 0

    def _wait_for_devtools(self) -> str:
        for line in self._process.stderr:
            match = LISTENING.search(line)
            if match:
                return match.group(1)
        raise RuntimeError(f"chromium exited ({self._process.wait()}) before its DevTools endpoint was up")

    async def _connect_page(self):
        import websockets

        host = self._browser_url.split("/devtools/")[0].removeprefix("ws://")
        targets = json.loads(await asyncio.to_thread(_http_get, f"http://{host}/json/list"))
        page = next(t for t in targets if t.get("type") == "page")
        return await websockets.connect(page["webSocketDebuggerUrl"], max_size=64 * 2 ** 20)

    def _call(self, method: str, **params) -> dict:
        async def call():
            self._ids += 1
            await self._socket.send(json.dumps({"id": self._ids, "method": method, "params": params}))
            while True:
                message = json.loads(await self._socket.recv())
                if message.get("id") == self._ids:
                    if "error" in message:
                        raise RuntimeError(f"{method}: {message['error']}")
                    return message.get("result", {})
        return self._loop.run_until_complete(asyncio.wait_for(call(), self.timeout_s))

    def before_each_page(self, script: str) -> None:
        """Runs `script` in every page this browser opens from now on, before the page's own scripts."""
        self._call("Page.enable")
        self._call("Page.addScriptToEvaluateOnNewDocument", source=script)

    def open(self, url: str, settle_s: float = 0.0) -> None:
        """Loads `url` and waits for its load event (then `settle_s` more, for a page's own scripts)."""
        self._call("Page.enable")
        self._call("Page.navigate", url=url)
        if not self.wait_for("document.readyState === 'complete'"):
            raise RuntimeError(f"{url} did not finish loading in {self.timeout_s:.0f} s")
        time.sleep(settle_s)

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (awaited when it is a promise)."""
        result = self._call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float | None = None) -> bool:
        """Polls `expression` until it is truthy; False after `timeout_s` (default: the browser's)."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while time.monotonic() < deadline:
            if self.evaluate(expression):
                return True
            time.sleep(0.2)
        return False

    def capture(self) -> bytes:
        """What the page shows now, as PNG bytes."""
        return base64.b64decode(self._call("Page.captureScreenshot", format="png")["data"])

    def screenshot(self, path: Path, png: bytes | None = None) -> Path:
        """Writes `png` (default: what the page shows now) to `path`."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.capture() if png is None else png)
        return path

    def close(self) -> None:
        try:
            self._loop.run_until_complete(self._socket.close())
        finally:
            self._loop.close()
            stop_session(self._process, CLOSE_GRACE_S)   # the browser's whole session: its zygote, renderers
            self._profile.cleanup()

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _http_get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()
