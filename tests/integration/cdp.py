# SPDX-License-Identifier: Apache-2.0
"""Headless Chromium driven over the DevTools protocol, with the stdlib only:
a minimal RFC 6455 websocket client (text frames, client masking,
fragmentation, ping/pong) and a Page wrapper that navigates, evaluates,
clicks with real mouse events, collects console errors and takes
screenshots. Used by dashboard_test.py and bench/dashboard.py.
"""
import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.request


class WebSocket:
    def __init__(self, url, timeout=30):
        m = re.match(r"ws://([^/:]+):(\d+)(/.*)", url)
        if not m:
            raise ValueError("not a ws:// url: " + url)
        host, port, path = m.group(1), int(m.group(2)), m.group(3)
        self.sock = socket.create_connection((host, port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((
            "GET %s HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n" % (path, host, port, key)
        ).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("websocket handshake: connection closed")
            head += chunk
        head, self.buffer = head.split(b"\r\n\r\n", 1)
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError("websocket handshake refused: %r" % head[:200])

    def _read(self, n):
        while len(self.buffer) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("websocket closed")
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def send(self, text, opcode=1):
        data = text.encode() if isinstance(text, str) else text
        header = bytes([0x80 | opcode])
        n = len(data)
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 65536:
            header += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        self.sock.sendall(header + mask + masked)

    def recv(self):
        """The next whole text message (control frames handled here)."""
        parts = []
        while True:
            b0, b1 = self._read(2)
            opcode, fin = b0 & 0x0F, b0 & 0x80
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else None
            payload = self._read(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 9:  # ping
                self.send(payload, opcode=10)
                continue
            if opcode == 8:
                raise ConnectionError("websocket closed by the peer")
            if opcode == 10:
                continue
            parts.append(payload)
            if fin:
                return b"".join(parts).decode()

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """One headless Chromium with a fresh profile; .page() gives its tab."""

    def __init__(self, width=1280, height=900):
        self.path = find_chromium()
        if not self.path:
            raise RuntimeError("chromium is not installed (`make setup` "
                               "installs it: tools/setup/apt-packages.txt)")
        self.profile = tempfile.mkdtemp(prefix="pcp-chromium-")
        self.proc = subprocess.Popen(
            [self.path, "--headless=new", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage", "--no-first-run",
             "--disable-extensions", "--disable-background-networking",
             "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
             "--user-data-dir=" + self.profile,
             "--window-size=%d,%d" % (width, height), "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.port = None
        deadline = time.time() + 30
        while time.time() < deadline:
            line = self.proc.stderr.readline().decode(errors="replace")
            if not line and self.proc.poll() is not None:
                break
            m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if m:
                self.port = int(m.group(1))
                break
        if not self.port:
            self.close()
            raise RuntimeError("chromium did not open its DevTools port")
        # Drain stderr so chromium never blocks on a full pipe.
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        try:
            while self.proc.stderr.read(65536):
                pass
        except (OSError, ValueError):
            pass

    def page(self):
        deadline = time.time() + 10
        while time.time() < deadline:
            with urllib.request.urlopen(
                    "http://127.0.0.1:%d/json/list" % self.port, timeout=5) as r:
                targets = json.loads(r.read())
            pages = [t for t in targets if t.get("type") == "page"]
            if pages:
                return Page(pages[0]["webSocketDebuggerUrl"])
            time.sleep(0.1)
        raise RuntimeError("chromium has no page target")

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


class Page:
    def __init__(self, ws_url):
        self.ws = WebSocket(ws_url)
        self.next_id = 0
        self.events = []
        self.errors = []  # console errors, exceptions, failed loads
        for method in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.call(method)

    def _note(self, msg):
        method = msg.get("method")
        p = msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            self.errors.append("exception: %s %s" % (
                d.get("text"), (d.get("exception") or {}).get("description")))
        elif method == "Runtime.consoleAPICalled" and p.get("type") == "error":
            self.errors.append("console.error: %s" % " ".join(
                str(a.get("value", a.get("description"))) for a in p.get("args", [])))
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            e = p["entry"]
            self.errors.append("log: %s %s" % (e.get("text"), e.get("url", "")))
        self.events.append(msg)
        del self.events[:-200]

    def call(self, method, params=None, timeout=60):
        self.next_id += 1
        mid = self.next_id
        self.ws.send(json.dumps({"id": mid, "method": method,
                                 "params": params or {}}))
        self.ws.sock.settimeout(timeout)
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError("%s: %s" % (method, msg["error"]))
                return msg.get("result", {})
            self._note(msg)

    def pump(self, seconds):
        """Reads events for |seconds| (console errors arrive as events)."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            self.ws.sock.settimeout(max(0.01, deadline - time.time()))
            try:
                self._note(json.loads(self.ws.recv()))
            except (socket.timeout, TimeoutError):
                break

    def evaluate(self, expression):
        r = self.call("Runtime.evaluate", {"expression": expression,
                                           "returnByValue": True,
                                           "awaitPromise": True})
        if "exceptionDetails" in r:
            raise RuntimeError("evaluate %r: %s" % (
                expression[:80], r["exceptionDetails"].get("text")))
        return r.get("result", {}).get("value")

    def navigate(self, url):
        self.call("Page.navigate", {"url": url})

    def wait(self, expression, seconds, what):
        deadline = time.time() + seconds
        last = None
        while time.time() < deadline:
            try:
                v = self.evaluate(expression)
            except RuntimeError as e:  # the page is still loading
                v, last = None, e
            if v:
                return v
            self.pump(0.1)
        raise TimeoutError("timed out after %ss waiting for %s%s" % (
            seconds, what, " (last error: %s)" % last if last else ""))

    def center(self, selector):
        r = self.evaluate(
            "(() => { const e = document.querySelector(%s); if (!e) return null;"
            " e.scrollIntoView({block: 'center'});"
            " const r = e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
            % json.dumps(selector))
        if not r:
            raise RuntimeError("no element matches " + selector)
        return r

    def click(self, selector):
        x, y = self.center(selector)
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {
                "type": kind, "x": x, "y": y, "button": "left",
                "clickCount": 1})

    def rect(self, selector):
        return self.evaluate(
            "(() => { const e = document.querySelector(%s); if (!e) return null;"
            " const r = e.getBoundingClientRect();"
            " return [r.left, r.top, r.width, r.height]; })()"
            % json.dumps(selector))

    def drag(self, selector, fx0, fx1, fy=0.5):
        """A left-button drag across |selector| from fraction fx0 to fx1
        of its width, at fraction fy of its height."""
        left, top, width, height = self.rect(selector)
        y = top + height * fy
        x0, x1 = left + width * fx0, left + width * fx1
        self.call("Input.dispatchMouseEvent", {
            "type": "mousePressed", "x": x0, "y": y, "button": "left",
            "clickCount": 1})
        for i in range(1, 6):
            self.call("Input.dispatchMouseEvent", {
                "type": "mouseMoved", "x": x0 + (x1 - x0) * i / 5, "y": y,
                "button": "left", "buttons": 1})
        self.call("Input.dispatchMouseEvent", {
            "type": "mouseReleased", "x": x1, "y": y, "button": "left",
            "clickCount": 1})

    def double_click(self, selector):
        x, y = self.center(selector)
        for count in (1, 2):
            for kind in ("mousePressed", "mouseReleased"):
                self.call("Input.dispatchMouseEvent", {
                    "type": kind, "x": x, "y": y, "button": "left",
                    "clickCount": count})

    def wheel(self, selector, delta_y):
        x, y = self.center(selector)
        self.call("Input.dispatchMouseEvent", {
            "type": "mouseWheel", "x": x, "y": y, "deltaX": 0,
            "deltaY": delta_y})

    def type_text(self, selector, text):
        self.evaluate("document.querySelector(%s).focus()" % json.dumps(selector))
        self.call("Input.insertText", {"text": text})

    def screenshot(self, path):
        m = self.call("Page.getLayoutMetrics")
        size = m.get("cssContentSize") or m.get("contentSize")
        r = self.call("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": size["width"],
                     "height": min(size["height"], 6000), "scale": 1}})
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(r["data"]))
        return os.path.getsize(path)

    def close(self):
        self.ws.close()
