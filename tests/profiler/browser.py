# Drive Debian's headless chromium to load the HTML timeline like a person's browser would.
#
# Two ways in. `dump_dom` and `screenshot` run chromium once per page (--dump-dom, --screenshot).
# `Browser` keeps one chromium open and speaks the DevTools protocol to it over a pipe
# (--remote-debugging-pipe: JSON messages separated by NUL bytes on file descriptors 3 and 4, no
# network port and no websocket), so a test can move the mouse, turn the wheel and click through
# the browser's own input pipeline (Input.dispatchMouseEvent: hit-testing, hover and event order
# as a person's mouse gets them), read the page with Runtime.evaluate, and take screenshots.
#
# Used by test_html.py and test_timeline_browser.py and, run as `python -m tests.profiler.browser
# TRACE.json docs`, to refresh the pictures in docs/profiler.md (see `main`).
from __future__ import annotations

import base64
import bisect
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars",
)


def find_chromium() -> str | None:
    """The path of a chromium-like browser, or None when none is installed."""
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    browser = find_chromium()
    if browser is None:
        raise RuntimeError("no chromium installed (apt-get install -y chromium)")
    with tempfile.TemporaryDirectory(prefix="atensor-chromium-") as profile_dir:
        return subprocess.run(
            [browser, *FLAGS, f"--user-data-dir={profile_dir}", *args],
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )


def dump_dom(page: Path, fragment: str = "", timeout: float = 120) -> str:
    """The page's DOM after load (scripts have run), as chromium serializes it."""
    url = page.resolve().as_uri() + (f"#{fragment}" if fragment else "")
    result = _run(["--dump-dom", url], timeout)
    if result.returncode != 0 or "<html" not in result.stdout:
        raise RuntimeError(f"chromium failed ({result.returncode}): {result.stderr[-2000:]}")
    return result.stdout


def screenshot(page: Path, png: Path, width: int = 1400, height: int = 480, timeout: float = 120) -> None:
    """Save a PNG of the page as a window of width x height shows it."""
    result = _run([f"--window-size={width},{height}", f"--screenshot={png.resolve()}",
                   page.resolve().as_uri()], timeout)
    if result.returncode != 0 or not png.exists():
        raise RuntimeError(f"chromium failed ({result.returncode}): {result.stderr[-2000:]}")


def _above_nine(fd: int) -> int:
    """A duplicate of `fd` numbered 10 or more (`fd` itself is closed)."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


class BrowserError(RuntimeError):
    """Chromium failed, timed out, or answered a DevTools command with an error."""


class Browser:
    """One headless chromium tab driven over the DevTools protocol (see the module comment).

    Example::

        with Browser(width=1200, height=500) as page:
            page.open(Path("timeline.html"))
            page.mouse_move(400, 200)
            print(page.evaluate("document.getElementById('tip').textContent"))
    """

    def __init__(self, width: int = 1200, height: int = 600, timeout: float = 60) -> None:
        self.width, self.height, self.timeout = width, height, timeout
        self._next_id = 0
        self._buffer = b""
        self._events: list[dict[str, Any]] = []
        self._session: str | None = None

    def __enter__(self) -> Browser:
        browser = find_chromium()
        if browser is None:
            raise BrowserError("no chromium installed (apt-get install -y chromium)")
        self._profile_dir = tempfile.TemporaryDirectory(prefix="atensor-chromium-")
        to_chrome_read, self._to_chrome = os.pipe()     # chromium reads commands on its fd 3
        self._from_chrome, from_chrome_write = os.pipe()   # and writes answers on its fd 4
        # the child's ends are moved above 9 first, so that putting one on fd 3 or 4 can never
        # overwrite the other (pytest's output capture, for one, holds low fds)
        to_chrome_read, from_chrome_write = _above_nine(to_chrome_read), _above_nine(from_chrome_write)
        # a small Python trampoline puts the pipe ends on fds 3 and 4 and execs chromium (not a
        # preexec_fn, which is unsafe with threads; not sh, which only redirects fds 0-9)
        trampoline = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
                      "os.close(int(sys.argv[1])); os.close(int(sys.argv[2])); "
                      "os.execv(sys.argv[3], sys.argv[3:])")
        self._process = subprocess.Popen(
            [sys.executable, "-c", trampoline, str(to_chrome_read), str(from_chrome_write), browser, *FLAGS,
             "--remote-debugging-pipe", f"--user-data-dir={self._profile_dir.name}",
             f"--window-size={self.width},{self.height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(to_chrome_read, from_chrome_write),
        )
        os.close(to_chrome_read)
        os.close(from_chrome_write)
        try:
            target = self.send("Target.createTarget", url="about:blank")["targetId"]
            self._session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            self.send("Page.enable")
            self.send("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                      deviceScaleFactor=1, mobile=False)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self._session = None
            self.send("Browser.close")
        except (BrowserError, OSError):
            pass
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        for fd in (self._to_chrome, self._from_chrome):
            try:
                os.close(fd)
            except OSError:
                pass
        self._profile_dir.cleanup()

    # -- the protocol -------------------------------------------------------------------------

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one DevTools command and return its result (BrowserError on an error answer)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if self._session is not None and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self._session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._events.append(reply)

    def _read(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_chrome], [], [], left)[0]:
                raise BrowserError(f"chromium did not answer within {self.timeout} s")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise BrowserError("chromium closed the DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def _wait_event(self, method: str) -> dict[str, Any]:
        for number, event in enumerate(self._events):
            if event.get("method") == method:
                return self._events.pop(number)
        while True:
            event = self._read()
            if event.get("method") == method:
                return event
            self._events.append(event)

    # -- what tests do ------------------------------------------------------------------------

    def open(self, page: Path, fragment: str = "") -> None:
        """Load a local page and wait for its load event (its scripts have run)."""
        self._events.clear()
        url = page.resolve().as_uri() + (f"#{fragment}" if fragment else "")
        self.send("Page.navigate", url=url)
        self._wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serializable values only)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} raised: {result['exceptionDetails']}")
        return result["result"].get("value")

    def settle(self) -> None:
        """Wait until the page has drawn what the last input asked for (two animation frames)."""
        self.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(1))))")

    def mouse_move(self, x: float, y: float) -> None:
        """Move the mouse to (x, y) in CSS pixels of the viewport, as a person's mouse would."""
        self.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        self.settle()

    def click(self, x: float, y: float) -> None:
        """Press and release the left button at (x, y)."""
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            extra = {} if kind == "mouseMoved" else {"button": "left", "clickCount": 1}
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, **extra)
        self.settle()

    def wheel(self, x: float, y: float, delta_y: float) -> None:
        """Turn the wheel at (x, y): negative delta_y zooms in on the timeline."""
        self.send("Input.dispatchMouseEvent", type="mouseWheel", x=x, y=y, deltaX=0, deltaY=delta_y)
        self.settle()

    def fit_height(self) -> None:
        """Make the viewport as tall as the page, so a screenshot has no empty space below it."""
        self.height = int(self.evaluate("document.documentElement.scrollHeight"))
        self.send("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                  deviceScaleFactor=1, mobile=False)
        self.settle()

    def screenshot(self, png: Path) -> None:
        """Save the viewport as a PNG."""
        png.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"]))


def main(argv: list[str]) -> int:
    """`python -m tests.profiler.browser TRACE.json [OUT_DIR]`: the pictures in docs/profiler.md.

    Writes OUT_DIR/profiler_zoomed_out.png (the whole trace) and OUT_DIR/profiler_zoomed_in.png
    (4 ms from the start of the middle jitted call, a replayed training step). Made from the
    flagship's trace: `XDG_CACHE_HOME=$(mktemp -d) python examples/train.py --profile t.json`.
    """
    from atensor.profiler import Profile

    if not argv:
        print(main.__doc__)
        return 2
    prof = Profile.load(argv[0])
    out = Path(argv[1] if len(argv) > 1 else "docs")
    timeline = prof.timeline()
    # the replayed step (a jitted call in the second half) with the most device work in 4 ms
    calls = sorted(h.start for h in timeline.host_spans if h.span.category == "call")
    starts = sorted(p.start for p in timeline.spans)
    later = calls[len(calls) // 2:] or [timeline.window[1] // 2]
    middle = max(later, key=lambda c: bisect.bisect(starts, c + 3_900_000) - bisect.bisect(starts, c))
    with tempfile.TemporaryDirectory() as tmp, Browser(width=1400, height=640) as page:
        page.open(prof.export(Path(tmp) / "timeline.html"))
        page.fit_height()
        page.screenshot(out / "profiler_zoomed_out.png")
        page.evaluate(f"atensorTimeline.setView({middle - 100_000}, {middle + 3_900_000})")
        # hover the widest device kernel on screen, so the picture shows a tooltip too
        box = page.evaluate(
            "(() => { const r = Array.from(document.querySelectorAll('rect.span[data-kind=kernel]'))"
            ".filter((n) => n.getAttribute('visibility') !== 'hidden')"
            ".sort((a, b) => b.getBoundingClientRect().width - a.getBoundingClientRect().width)[0];"
            " if (!r) return null; const b = r.getBoundingClientRect();"
            " return [b.left + Math.min(b.width / 2, 40), b.top + b.height / 2]; })()")
        if box is not None:
            page.mouse_move(*box)
        page.screenshot(out / "profiler_zoomed_in.png")
    print(f"wrote {out / 'profiler_zoomed_out.png'} and {out / 'profiler_zoomed_in.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
