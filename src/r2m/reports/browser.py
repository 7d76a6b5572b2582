"""Headless Chromium, driven over the Chrome DevTools Protocol on a pipe: open a page at a given
width, evaluate JavaScript in it, take a full-page screenshot. The report's browser test and
``scripts/screenshot_report.sh`` use it; nothing is downloaded (Debian's ``chromium`` package) and
nothing beyond the standard library is needed.

Chromium started with ``--remote-debugging-pipe`` reads protocol messages from its file descriptor 3
and writes to 4, each message one JSON object followed by a NUL byte. :class:`Browser` starts it with
those two pipes, a new empty profile folder and the flags of :data:`FLAGS` (no network of its own: no
updates, sync or background requests), and :class:`Page` is one tab attached in "flat" mode (commands
carry the tab's ``sessionId``).

    with Browser() as browser:
        page = browser.open(Path("reports/index.html"), width=390)
        page.evaluate("document.title")
        page.screenshot(Path("shot.png"))

``python -m r2m.reports.browser PAGE OUT.png [--width W] [--element SELECTOR]`` writes a screenshot of the
whole page or of one element.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INSTALL = "Debian/Ubuntu: apt-get install -y chromium (as root); or set R2M_CHROMIUM to a Chromium binary"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
         "--remote-debugging-pipe")
HEIGHT = 900  # the viewport's height (CSS px) when a page is opened


class BrowserError(RuntimeError):
    """Chromium could not be started, exited, answered with an error, or did not answer in time."""


def find_chromium() -> str | None:
    """The Chromium binary: ``$R2M_CHROMIUM`` when set, else the first of :data:`NAMES` on ``PATH``."""
    given = os.environ.get("R2M_CHROMIUM")
    if given:
        return given if shutil.which(given) else None
    return next((path for path in map(shutil.which, NAMES) if path), None)


class Browser:
    """One headless Chromium process with a new profile folder; closed (process ended, folder removed)
    on :meth:`close` or at the end of a ``with`` block. ``timeout``: seconds any one answer may take."""

    def __init__(self, executable: str | None = None, timeout: float = 60.0) -> None:
        exe = executable or find_chromium()
        if not exe:
            raise BrowserError(f"no Chromium found ({', '.join(NAMES)}); {INSTALL}")
        self.timeout = timeout
        self._profile = tempfile.mkdtemp(prefix="r2m-chromium-")
        self._next_id = 0
        self._buffer = b""
        self._events: list[dict[str, Any]] = []
        to_child, self._write = os.pipe()  # the browser reads commands on its fd 3
        self._read, from_child = os.pipe()  # and writes answers and events on its fd 4
        # the child's ends above 9 first (a pipe end may itself be 3 or 4), close-on-exec like every pipe end
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_child, from_child)]
        for fd in (to_child, from_child):
            os.close(fd)
        to_child, from_child = high

        def on_fd_3_and_4() -> None:  # in the child, before exec: its ends at 3 and 4, kept open by exec
            os.dup2(to_child, 3)
            os.dup2(from_child, 4)

        self._log = open(Path(self._profile) / "chromium.log", "wb")  # noqa: SIM115 (closed in close())
        try:
            self.proc = subprocess.Popen([exe, *FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
                                         stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                                         close_fds=False, preexec_fn=on_fd_3_and_4, start_new_session=True)
        except OSError as err:
            self._cleanup()
            raise BrowserError(f"cannot start {exe}: {err}") from None
        finally:
            os.close(to_child)
            os.close(from_child)
        try:
            self.version = self.call("Browser.getVersion").get("product", "")
        except BrowserError:
            self.close()
            raise

    # ------------------------------------------------------------------ protocol
    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        """Send one command (to the tab ``session``, or the browser) and return its result."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        try:
            while data:
                data = data[os.write(self._write, data):]
        except OSError as err:
            raise BrowserError(f"{method}: the browser is gone ({err}){self._log_tail()}") from None
        answer = self._wait(lambda m: m.get("id") == self._next_id, method)
        if "error" in answer:
            raise BrowserError(f"{method}: {answer['error'].get('message', answer['error'])}")
        return answer.get("result", {})

    def wait_event(self, method: str, session: str | None = None) -> dict[str, Any]:
        """The first event ``method`` (of the tab ``session``) not yet taken, waiting for it if needed."""
        return self._wait(lambda m: m.get("method") == method and m.get("sessionId") == session, method)

    def _wait(self, wanted: Any, what: str) -> dict[str, Any]:
        for k, event in enumerate(self._events):
            if wanted(event):
                return self._events.pop(k)
        deadline = time.monotonic() + self.timeout
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                message = json.loads(raw)
                if wanted(message):
                    return message
                if "method" in message:
                    self._events.append(message)
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"{what}: no answer from the browser within {self.timeout:g} s")
            ready, _, _ = select.select([self._read], [], [], left)
            if ready:
                chunk = os.read(self._read, 1 << 20)
                if not chunk:
                    raise BrowserError(f"{what}: the browser exited (code {self.proc.poll()}){self._log_tail()}")
                self._buffer += chunk

    def _log_tail(self) -> str:
        try:
            lines = (Path(self._profile) / "chromium.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return f"; its last line: {lines[-1]}" if lines else ""

    # ------------------------------------------------------------------ pages
    def open(self, path: Path | str, width: int, height: int = HEIGHT) -> Page:
        """A new tab ``width`` × ``height`` CSS pixels (device scale 1) showing the file ``path``, returned once
        its load event fired (every image loaded or failed)."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, target, session, width, height)
        page.call("Page.enable")
        page.resize(width, height)
        page.call("Page.navigate", {"url": Path(path).resolve().as_uri()})
        self.wait_event("Page.loadEventFired", session)
        return page

    # ------------------------------------------------------------------ end
    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call("Browser.close")
            except BrowserError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # its own process group: the browser and its helpers
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._cleanup()

    def _cleanup(self) -> None:
        for fd in (self._write, self._read):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Page:
    """One tab of a :class:`Browser`."""

    def __init__(self, browser: Browser, target: str, session: str, width: int, height: int) -> None:
        self.browser, self.target, self.session = browser, target, session
        self.width, self.height = width, height

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.call(method, params, self.session)

    def resize(self, width: int, height: int) -> None:
        """Emulate a ``width`` × ``height`` viewport (a phone's width lays the page out as on the phone:
        the page's ``<meta name=viewport>`` is honoured)."""
        self.width, self.height = width, height
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600})

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-like; a promise is awaited); an exception
        thrown in the page is a :class:`BrowserError` with its message."""
        got = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                             "awaitPromise": True})
        if "exceptionDetails" in got:
            details = got["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text", "")
            raise BrowserError(f"JavaScript error in the page: {text}")
        return got.get("result", {}).get("value")

    def screenshot(self, out: Path, full_page: bool = True, selector: str | None = None) -> Path:
        """A PNG of the viewport, of the whole page's height at the viewport's width (``full_page``), or of
        the element ``selector`` (a CSS selector) names."""
        width, height = self.width, self.height
        if full_page or selector:
            full = int(self.evaluate("Math.ceil(document.documentElement.scrollHeight)"))
            self.resize(width, max(height, full))
        params: dict[str, Any] = {"format": "png"}
        try:
            if selector:
                box = self.evaluate(  # the element's box and a margin of up to 8 px, inside the page
                    f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
                    " const r = e.getBoundingClientRect(), m = 8, w = document.documentElement.scrollWidth;"
                    " const x = Math.max(0, r.left + scrollX - m), y = Math.max(0, r.top + scrollY - m);"
                    " return [x, y, Math.min(w, r.right + scrollX + m) - x, r.bottom + scrollY + m - y]; })()")
                if box is None:
                    raise BrowserError(f"no element {selector} on the page")
                params["clip"] = dict(zip(("x", "y", "width", "height"), box, strict=True)) | {"scale": 1}
            data = self.call("Page.captureScreenshot", params)["data"]
        finally:
            if full_page or selector:
                self.resize(width, height)
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(base64.b64decode(data))
        return out

    def close(self) -> None:
        self.browser.call("Target.closeTarget", {"targetId": self.target})


SCREENSHOT = "screenshot"  # the writer kind of `python -m r2m.reports.browser PAGE OUT`


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m r2m.reports.browser",
                                     description="A PNG of a page as headless Chromium shows it.")
    parser.add_argument("page", type=Path, help="the HTML file (e.g. reports/index.html)")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--width", type=int, default=1280, help="viewport width in CSS pixels (default 1280)")
    parser.add_argument("--element", default=None, metavar="SELECTOR",
                        help="only this element (a CSS selector such as '#claims'); default: the whole page")
    args = parser.parse_args(argv)
    if not args.page.is_file():
        print(f"screenshot: {args.page}: no such file (run: r2m report)", file=sys.stderr)
        return 2
    from r2m.utils.guard import BadInput
    from r2m.utils.owner import claim, mark_file

    try:
        claim(args.out, SCREENSHOT, "out", folder=False)  # a new file, or a screenshot this command wrote
        with Browser() as browser:
            mark_file(browser.open(args.page, args.width).screenshot(args.out, selector=args.element), SCREENSHOT)
    except (BrowserError, BadInput) as err:
        print(f"screenshot: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.out} ({args.width} px wide{', ' + args.element if args.element else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
