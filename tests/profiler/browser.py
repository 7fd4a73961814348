# Drive Debian's headless chromium to load the HTML timeline like a person's browser would.
#
# Used by test_html.py (load the page, read the DOM after its scripts ran) and, run as
# `python -m tests.profiler.browser docs/profiler_timeline.png`, to refresh the screenshot in
# the docs from the simulated training step in sample_events.py.
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

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


def main(argv: list[str]) -> int:
    """Write a screenshot of the simulated training step's timeline to argv[0]."""
    from atensor.profiler import Profile

    from .sample_events import simulate_step

    target = Path(argv[0] if argv else "docs/profiler_timeline.png")
    run = simulate_step()
    prof = Profile.from_events(run.spans, run.host_spans, run.memory, run.clock_offsets)
    with tempfile.TemporaryDirectory() as tmp:
        page = prof.export(Path(tmp) / "timeline.html")
        screenshot(page, target)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
