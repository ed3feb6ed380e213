"""Headless Chromium: render a report to PNG and read back the page it laid out.

Used by ``suite report --screenshot`` (the README's picture) and by the tests that check the report in a real
browser. Chromium is started as Debian's package is (``/usr/bin/chromium``), headless, with a fresh profile and
background networking off (nothing is fetched; a closed network would otherwise stall it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from suite.errors import SuiteError

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--force-device-scale-factor=1")


def find_chromium() -> str | None:
    """``$SUITE_CHROMIUM`` or the first Chromium/Chrome on PATH; ``None`` if there is none."""
    explicit = os.environ.get("SUITE_CHROMIUM")
    if explicit:
        return explicit if shutil.which(explicit) else None
    return next((found for name in CANDIDATES if (found := shutil.which(name))), None)


def _run(args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    chromium = find_chromium()
    if chromium is None:
        raise SuiteError("no Chromium found (install Debian's 'chromium' package, or set SUITE_CHROMIUM to a "
                         "Chrome/Chromium binary)")
    with tempfile.TemporaryDirectory(prefix="suite-chromium-") as profile:
        try:
            done = subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                                  text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise SuiteError(f"Chromium did not finish within {timeout_s:.0f} s") from None
    if done.returncode != 0:
        tail = " ".join(done.stderr.split()[-40:])
        raise SuiteError(f"Chromium failed (exit {done.returncode}): {tail}")
    return done


def screenshot(page: Path, png: Path, width: int = 1400, height: int = 2600, timeout_s: float = 120) -> Path:
    """Render ``page`` (an HTML file) to ``png`` at ``width`` x ``height`` CSS pixels. Chromium writes into a folder
    of its own; the picture is then made new at ``png`` and renamed into place (a link there is replaced, never
    written through)."""
    import tempfile

    from suite.fileio import write_bytes_atomic

    with tempfile.TemporaryDirectory(prefix="suite-screenshot-") as scratch:
        shot = Path(scratch) / "page.png"
        _run([f"--window-size={width},{height}", f"--screenshot={shot}", page.resolve().as_uri()], timeout_s)
        if not shot.is_file() or shot.stat().st_size == 0:
            raise SuiteError(f"Chromium wrote no screenshot for {png}")
        write_bytes_atomic(png, shot.read_bytes())
    return png


def rendered_dom(page: Path, timeout_s: float = 120) -> str:
    """The page's DOM as Chromium laid it out (``--dump-dom``)."""
    return _run(["--dump-dom", page.resolve().as_uri()], timeout_s).stdout
