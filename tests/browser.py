"""Headless Chromium as a measuring instrument for report pages: the load time of a page and a screenshot of its
first screen (1400 x 900). Used by tests/report/test_report_browser.py, and on its own to compare two pages:

    python tests/browser.py PAGE.html [SCREENSHOT.png]

Chromium is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: JSON messages separated by
NUL bytes on file descriptors 3 and 4), so nothing beyond the standard library is needed. The load time is read
from the page's own clock (``performance.now()``, milliseconds since navigation started) once its load event has
fired and, for a page with the lazy renderer (``<html data-ready>``), once plotly is unpacked and the figures of
the first screen are drawn, whichever is later. A page without the renderer draws all its figures in inline
scripts before its load event, so for it the load event is the time to the first screen.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WIDTH, HEIGHT = 1400, 900
READY = """new Promise(function (done) {
  function check() {
    var root = document.documentElement, lazy = !!document.getElementById("ib-plotly");
    if (document.readyState === "complete" && (!lazy || root.dataset.ready)) {
      done(JSON.stringify({load_ms: performance.now(), lazy: lazy,
                           onload_ms: performance.timing.loadEventEnd - performance.timing.navigationStart}));
    } else { setTimeout(check, 5); }
  }
  check();
})"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One headless Chromium with one page, driven over the DevTools pipe."""

    def __init__(self) -> None:
        self.profile = tempfile.mkdtemp(prefix="ib-chromium-")
        to_child_r, self._w = os.pipe()
        self._r, from_child_w = os.pipe()
        # the child reads commands on fd 3 and writes replies on fd 4
        self.proc = subprocess.Popen(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", f"--user-data-dir={self.profile}", "--host-resolver-rules=MAP * ~NOTFOUND",
             f"--window-size={WIDTH},{HEIGHT}", "--remote-debugging-pipe", "about:blank"],
            pass_fds=(3, 4), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=lambda: (os.dup2(to_child_r, 3), os.dup2(from_child_w, 4)))
        os.close(to_child_r), os.close(from_child_w)
        self._id, self._buf = 0, b""
        targets = self.call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=WIDTH, height=HEIGHT,
                  deviceScaleFactor=1, mobile=False)

    def call(self, method: str, session: bool = False, timeout: float = 120, **params) -> dict:
        self._id += 1
        msg = dict(id=self._id, method=method, params=params)
        if session:
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            while b"\0" not in self._buf:
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed the DevTools pipe")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
        raise TimeoutError(method)

    def open(self, page: Path) -> dict:
        """Navigate to ``page`` and wait for its first screen: {'load_ms', 'onload_ms', 'lazy'}."""
        self.call("Page.navigate", session=True, url=Path(page).resolve().as_uri())
        time.sleep(0.05)  # let the navigation commit, so the check below runs in the new document
        for _ in range(200):
            got = self.call("Runtime.evaluate", session=True, expression=READY, awaitPromise=True,
                            returnByValue=True)
            value = got.get("result", {}).get("value")
            if value:
                return json.loads(value)
            time.sleep(0.05)
        raise TimeoutError(f"{page} never became ready")

    def screenshot(self, png: Path) -> Path:
        data = self.call("Page.captureScreenshot", session=True, format="png")["data"]
        png = Path(png)
        png.parent.mkdir(parents=True, exist_ok=True)
        png.write_bytes(base64.b64decode(data))
        return png

    def evaluate(self, expression: str):
        return self.call("Runtime.evaluate", session=True, expression=expression, awaitPromise=True,
                         returnByValue=True).get("result", {}).get("value")

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self._w), os.close(self._r)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def measure(page: Path, png: Path | None = None, runs: int = 3) -> list[dict]:
    """Load ``page`` ``runs`` times, each in a fresh browser (cold caches); a screenshot after the first."""
    out = []
    for i in range(runs):
        with Browser() as b:
            out.append(b.open(page))
            if png is not None and i == 0:
                b.screenshot(png)
    return out


if __name__ == "__main__":
    target = Path(sys.argv[1])
    times = measure(target, Path(sys.argv[2]) if len(sys.argv) > 2 else None)
    print(f"{target}: {target.stat().st_size:,} bytes; first screen ms (3 fresh browsers): "
          + ", ".join(f"{t['load_ms']:.0f} (load event {t['onload_ms']:.0f})" for t in times))
