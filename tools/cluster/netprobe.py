#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A timed TCP transfer between two cluster hosts, iperf-like, standard
library only (tools/cluster; docs/cluster.md).

  netprobe.py serve --bind ADDR --port P [--timeout S]
      accepts one connection, reads until EOF, prints one JSON line:
      {"bytes", "seconds", "mbit_s"} measured from the first byte received
      to the last (what the link delivered, not what the sender queued).
  netprobe.py send --to ADDR:P --seconds S
      sends for S seconds, then closes; prints {"bytes_sent", "seconds"}.
  netprobe.py reach ADDR
      exit 0 when ADDR answers a TCP connect to port 9 (accepted or
      refused: either way the host is there), 1 after 3 s without an
      answer or with no route (ping is not installed everywhere).

Both are bounded: serve gives up after --timeout seconds (default 30)
without a connection or between two reads; send runs at most S seconds
plus the connect timeout.
"""
import argparse
import json
import socket
import sys
import time

CHUNK = 256 * 1024


def serve(bind, port, timeout):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((bind, port))
    srv.listen(1)
    srv.settimeout(timeout)
    # The caller waits for this line before it starts the sender.
    print(json.dumps({"listening": "%s:%d" % (bind, port)}), flush=True)
    conn, _ = srv.accept()
    conn.settimeout(timeout)
    buf = bytearray(CHUNK)
    total, first, last = 0, None, None
    while True:
        n = conn.recv_into(buf)
        if n == 0:
            break
        now = time.monotonic()
        if first is None:
            first = now
        total += n
        last = now
    conn.close()
    srv.close()
    seconds = (last - first) if first is not None and last > first else 0.0
    print(json.dumps({"bytes": total, "seconds": round(seconds, 4),
                      "mbit_s": round(total * 8 / seconds / 1e6, 2)
                      if seconds else None}), flush=True)
    return 0


def send(to, seconds):
    host, _, port = to.rpartition(":")
    payload = b"\x5a" * CHUNK
    with socket.create_connection((host, int(port)), timeout=10) as s:
        t0 = time.monotonic()
        sent = 0
        while time.monotonic() - t0 < seconds:
            s.sendall(payload)
            sent += len(payload)
        s.shutdown(socket.SHUT_WR)
        # Wait for the reader to close: the transfer is over when the data
        # arrived, not when it left this socket's buffer.
        s.settimeout(60)
        while s.recv(4096):
            pass
        elapsed = time.monotonic() - t0
    print(json.dumps({"bytes_sent": sent, "seconds": round(elapsed, 4)}),
          flush=True)
    return 0


def reach(addr):
    try:
        with socket.create_connection((addr, 9), timeout=3):
            pass
    except ConnectionRefusedError:
        pass
    except OSError as e:
        print("netprobe: %s does not answer: %s" % (addr, e),
              file=sys.stderr)
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("serve")
    p.add_argument("--bind", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--timeout", type=float, default=30.0)
    p = sub.add_parser("send")
    p.add_argument("--to", required=True)
    p.add_argument("--seconds", type=float, required=True)
    p = sub.add_parser("reach")
    p.add_argument("addr")
    a = ap.parse_args()
    if a.cmd == "reach":
        return reach(a.addr)
    if a.cmd == "serve":
        return serve(a.bind, a.port, a.timeout)
    if not 0 < a.seconds <= 60:
        print("netprobe: --seconds must be in (0, 60]", file=sys.stderr)
        return 2
    return send(a.to, a.seconds)


if __name__ == "__main__":
    sys.exit(main())
