"""A minimal Chrome DevTools Protocol client over ``--remote-debugging-pipe`` (stdlib only) for browser tests.

Chromium reads commands from fd 3 and writes replies and events to fd 4, one JSON message per NUL-terminated
chunk. ``Browser`` starts headless Chromium on a page, attaches to it, and offers the few calls the tests
need: evaluate JavaScript, click an element with real mouse events, type keys, and accept dialogs.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS: tuple[str, ...] = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--remote-debugging-pipe",
)


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class CDPError(RuntimeError):
    pass


class Browser:
    def __init__(self, url: str, profile: Path, *, timeout: float = 20.0) -> None:
        exe = chromium_path()
        if exe is None:
            raise CDPError("chromium not found (apt-get install chromium)")
        self.timeout = timeout
        cmd_r, self._cmd_w = os.pipe()
        self._out_r, out_w = os.pipe()

        def _fds() -> None:  # in the child: chromium's pipe ends at fds 3 and 4
            os.dup2(cmd_r, 3)
            os.dup2(out_w, 4)

        self.proc = subprocess.Popen(
            [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", url],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_fds,  # noqa: PLW1509 - the child only dup2()s two fds before exec
            pass_fds=(3, 4),
        )
        os.close(cmd_r)
        os.close(out_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None
        page = self._wait_page()
        self.session = self.call("Target.attachToTarget", targetId=page, flatten=True, browser=True)["sessionId"]
        self.call("Page.enable")
        self.call("Runtime.enable")

    def _wait_page(self) -> str:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            targets = self.call("Target.getTargets", browser=True)["targetInfos"]
            pages = [t["targetId"] for t in targets if t["type"] == "page"]
            if pages:
                return str(pages[0])
            time.sleep(0.05)
        raise CDPError("chromium opened no page")

    def _send(self, msg: dict[str, Any]) -> None:
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")

    def _recv(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CDPError("no answer from chromium in time")
            ready, _, _ = select.select([self._out_r], [], [], left)
            if ready:
                chunk = os.read(self._out_r, 1 << 16)
                if not chunk:
                    raise CDPError("chromium closed the pipe")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        msg: dict[str, Any] = json.loads(raw)
        return msg

    def call(self, method: str, *, browser: bool = False, **params: Any) -> dict[str, Any]:
        """Send a command (to the page session unless ``browser``) and wait for its result; dialogs the page
        opens meanwhile are accepted."""
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if self.session and not browser:
            msg["sessionId"] = self.session
        self._send(msg)
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._recv(deadline)
            if reply.get("id") == msg["id"]:
                if "error" in reply:
                    raise CDPError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            if "method" in reply:
                self.events.append(reply)
                if reply["method"] == "Page.javascriptDialogOpening":
                    self._id += 1
                    self._send(
                        {
                            "id": self._id,
                            "method": "Page.handleJavaScriptDialog",
                            "params": {"accept": True},
                            "sessionId": reply.get("sessionId"),
                        }
                    )

    def js(self, expression: str) -> Any:
        out = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in out:
            raise CDPError(f"{expression}: {out['exceptionDetails']}")
        return out["result"].get("value")

    def wait_for(self, expression: str, timeout: float | None = None) -> Any:
        deadline = time.monotonic() + (timeout or self.timeout)
        while time.monotonic() < deadline:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.05)
        raise CDPError(f"timed out waiting for {expression}")

    def click(self, selector: str) -> None:
        """A real left click (mouse moved, pressed, released) at the centre of the element."""
        box = self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        if box is None:
            raise CDPError(f"no element {selector}")
        x, y = box
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def key(self, key: str) -> None:
        """Press and release one key (a character such as ``y``, or ``Enter`` / ``ArrowRight``)."""
        text = key if len(key) == 1 else ("\r" if key == "Enter" else "")
        down: dict[str, Any] = {"type": "keyDown" if text else "rawKeyDown", "key": key}
        if text:
            down["text"] = text
        self.call("Input.dispatchKeyEvent", **down)
        self.call("Input.dispatchKeyEvent", type="keyUp", key=key)

    def type_text(self, text: str) -> None:
        self.call("Input.insertText", text=text)

    def allow_downloads(self, folder: Path) -> None:
        self.call("Browser.setDownloadBehavior", browser=True, behavior="allow", downloadPath=str(folder))

    def close(self) -> None:
        try:
            self.call("Browser.close", browser=True)
        except (CDPError, OSError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._cmd_w, self._out_r):
            try:
                os.close(fd)
            except OSError:
                pass
