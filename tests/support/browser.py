"""A real headless Chromium driven over the DevTools protocol (a pipe, no network port, no extra package).

`load(path)` opens a local HTML file and returns what a user's browser would do with it:
every request other than the file itself, every console message, uncaught exception and
browser log error (a Content-Security-Policy violation is one), a full-page screenshot
as PNG bytes and the page boxes of the elements asked for. Chromium comes from the
system's packages (`apt-get install chromium`); without it `chromium_binary()` fails the
test with the command that installs it, never skips it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
TIMEOUT_S = 60.0


def chromium_binary() -> str:
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(
        "Chromium is not installed: the HTML report tests need a real browser. "
        "Install it with `apt-get update && apt-get install -y chromium` (.ci/run does).",
        pytrace=False,
    )


@dataclass
class PageLoad:
    url: str
    requests: list[str] = field(default_factory=list)  # URLs asked for besides the page itself
    errors: list[str] = field(default_factory=list)  # console errors, exceptions, log errors
    console: list[str] = field(default_factory=list)  # every console message
    screenshot: bytes = b""
    boxes: dict = field(default_factory=dict)  # CSS selector -> {x, y, width, height} in page pixels
    values: dict = field(default_factory=dict)  # JavaScript expression -> its value (JSON-like)
    height: int = 0  # the page's full height in CSS pixels


class BrowserExited(RuntimeError):
    """The browser closed its end of the pipe; the message holds what it printed."""


def _argv(profile: str) -> list[str]:
    return [
        chromium_binary(),
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        "--remote-debugging-pipe",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--disable-sync",
        "--disable-background-networking",
        "--disable-component-update",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "about:blank",
    ]


def _started() -> tuple["_Pipe", str, str]:
    """(the browser, its first tab, its profile folder). A browser that dies at start (on a loaded machine:
    its crash handler or zygote failing) is started once more with a fresh profile; if that one dies too,
    the test fails with what both printed."""
    printed = []
    for _ in range(2):
        profile = tempfile.mkdtemp(prefix="devprof-chromium-")
        pipe = _Pipe(_argv(profile))
        try:
            return pipe, pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"], profile
        except (BrowserExited, BrokenPipeError) as exc:
            if isinstance(exc, BrokenPipeError):  # it was gone before the first command was written
                pipe.process.wait(timeout=30)
                exc = BrowserExited(f"the browser exited: {pipe.stderr_tail()}")
            printed.append(str(exc))
            pipe.close()
            shutil.rmtree(profile, ignore_errors=True)
    pytest.fail("Chromium exited at start twice, each with a fresh profile:\n" + "\n---\n".join(printed), pytrace=False)


class _Pipe:
    """DevTools protocol messages over Chromium's --remote-debugging-pipe (fd 3 in, fd 4 out)."""

    def __init__(self, argv: list[str]):
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def wire():  # the browser reads commands on fd 3 and writes replies on fd 4
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=wire,
            pass_fds=(3, 4),
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout
        for event in self.events:
            if event.get("method") == method:
                return event
        while time.monotonic() < deadline:
            event = self._read(deadline - time.monotonic())
            self.events.append(event)
            if event.get("method") == method:
                return event
        raise TimeoutError(f"no {method} within {timeout:g} s")

    def drain(self, seconds: float) -> None:
        """Collect the events of the next `seconds` (late console messages)."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                self.events.append(self._read(deadline - time.monotonic()))
            except TimeoutError:
                return

    def _read(self, timeout: float = TIMEOUT_S) -> dict:
        import select

        deadline = time.monotonic() + max(0.0, timeout)
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            poller = select.poll()  # not select(): late in a long run the pipe's number can pass 1023
            poller.register(self._from_child, select.POLLIN | select.POLLHUP)
            if left <= 0 or not poller.poll(left * 1000):
                raise TimeoutError("the browser did not answer")
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise BrowserExited(f"the browser exited: {self.stderr_tail()}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def stderr_tail(self) -> str:
        """The end of what the browser wrote on stderr: why it exited."""
        assert self.process.stderr is not None  # Popen(stderr=PIPE)
        return self.process.stderr.read().decode(errors="replace")[-2000:]

    def close(self) -> None:
        try:
            os.close(self._to_child)
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        finally:
            os.close(self._from_child)
            if self.process.stderr:
                self.process.stderr.close()


def load(
    path: str | Path,
    *,
    width: int = 1280,
    height: int = 900,
    boxes: tuple[str, ...] = (),
    evaluate: tuple[str, ...] = (),
) -> PageLoad:
    """Open `path` in headless Chromium at `width` x `height` and record what happens; the value of each
    expression in `evaluate`, run in the page once it has loaded, goes to `values`."""
    url = Path(path).resolve().as_uri()
    pipe, target, profile = _started()
    result = PageLoad(url)
    try:
        session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Network", "Runtime", "Log"):
            pipe.send(f"{domain}.enable", session=session)
        pipe.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session,
        )
        pipe.events.clear()  # about:blank's own events
        pipe.send("Page.navigate", {"url": url}, session)
        pipe.wait_for("Page.loadEventFired")
        pipe.drain(0.5)
        for selector in boxes:
            found = pipe.send(
                "Runtime.evaluate",
                {
                    "expression": (
                        f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null; "
                        "const r = e.getBoundingClientRect(); return JSON.stringify({x: r.left + scrollX, "
                        "y: r.top + scrollY, width: r.width, height: r.height}); })()"
                    ),
                    "returnByValue": True,
                },
                session,
            )
            value = found.get("result", {}).get("value")
            result.boxes[selector] = json.loads(value) if value else None
        for expression in evaluate:
            found = pipe.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
            if "exceptionDetails" in found:
                raise RuntimeError(f"{expression}: {found['exceptionDetails']}")
            result.values[expression] = found.get("result", {}).get("value")
        metrics = pipe.send("Page.getLayoutMetrics", session=session)
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        result.height = int(size["height"])
        shot = pipe.send(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": max(height, result.height), "scale": 1},
            },
            session,
        )
        import base64

        result.screenshot = base64.b64decode(shot["data"])
        pipe.drain(0.2)
    finally:
        pipe.close()
        shutil.rmtree(profile, ignore_errors=True)
    for event in pipe.events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Network.requestWillBeSent":
            requested = params["request"]["url"]
            if requested != url and not requested.startswith("data:"):
                result.requests.append(requested)
        elif method == "Runtime.consoleAPICalled":
            text = " ".join(str(arg.get("value", arg.get("description", ""))) for arg in params.get("args", []))
            result.console.append(f"{params.get('type')}: {text}")
            if params.get("type") in ("error", "assert", "warning"):
                result.errors.append(f"console.{params.get('type')}: {text}")
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            result.errors.append(
                f"exception: {details.get('text')} {details.get('exception', {}).get('description', '')}"
            )
        elif method == "Log.entryAdded":
            entry = params.get("entry", {})
            result.console.append(f"{entry.get('level')}: {entry.get('text')}")
            if entry.get("level") in ("error", "warning") or entry.get("source") in ("security", "violation"):
                result.errors.append(f"{entry.get('source')} {entry.get('level')}: {entry.get('text')}")
    return result
