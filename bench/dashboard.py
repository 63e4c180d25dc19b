# SPDX-License-Identifier: Apache-2.0
"""bench/dashboard (run through build/bench/dashboard).

  1. Render time: a gateway whose store holds a succeeded training job of
     1,000 outer steps (seeded by `dashboard --seed` through the store API,
     no workers); headless Chromium loads its job page (#/jobs/ID) N times,
     each a fresh document; the time is the page's own performance mark
     "pcp-job-rendered" (navigation start to the loss, tokens/s and wire
     charts drawn and painted; the timeline fills in after). Baseline: an empty
     page from the same server (/healthz, a few bytes of JSON), navigation
     start to its load event. Medians; the loss chart must hold 1,000
     points.
  2. SSE: while 50 job events per second are written to the store (by
     `dashboard --append`, its own store connection), the gateway's CPU
     (utime + stime from /proc/PID/stat) over a 5 s window with no
     subscriber and with 32 /v1/events subscribers reading every event;
     reported as CPU milliseconds per subscriber per second.

Last line: `dashboard ratio=<empty page ms / job page ms>` (higher is
better). Goals (a "dashboard goal ...: met|MISSED" line each; exit 1 on a
miss under PCP_BENCH_CHECK=1): the job page within GOAL_MS, at most 5 ms of
gateway CPU per subscriber per second.
"""
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import cdp  # noqa: E402

STEPS = 1000
RUNS = int(os.environ.get("PCP_BENCH_DASHBOARD_RUNS", "7"))
SUBSCRIBERS = 32  # the gateway accepts 64 streams
WINDOW_S = 5.0
EVENT_RATE = 50
GOAL_MS = 1500.0
GOAL_SSE_CPU_MS = 5.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(base, path):
    with urllib.request.urlopen(base + path, timeout=30) as r:
        return json.loads(r.read())


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime, stime: fields 14 and 15 of the whole line (1-based).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def gateway_cpu_over(pid, seconds):
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - c0) / (time.monotonic() - t0)


def subscribe(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
              b"Accept: text/event-stream\r\n\r\n")
    head = s.recv(4096)
    if b" 200 " not in head.split(b"\r\n", 1)[0]:
        raise RuntimeError("SSE subscribe: %r" % head[:200])
    s.setblocking(False)
    return s


def main():
    pcp, self_path = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(prefix="pcp-bench-dash-")
    state = os.path.join(work, "state")
    t0 = time.monotonic()
    job = subprocess.run([self_path, "--seed", state, str(STEPS)], check=True,
                         capture_output=True, text=True).stdout.strip()
    print("seeded %s: %d training.step events through the store API in "
          "%.2f s" % (job, STEPS, time.monotonic() - t0), flush=True)
    api_port, fabric_port = free_port(), free_port()
    base = "http://127.0.0.1:%d" % api_port
    config = os.path.join(work, "g.json")
    with open(config, "w") as f:
        json.dump({"gateway_id": "bench", "lab_id": "lab", "state_dir": state,
                   "worker_fabric": {"host": "127.0.0.1",
                                     "port": fabric_port,
                                     "join_token_env": "BENCH_JOIN"}}, f)
    gw = subprocess.Popen([pcp, "--gateway", "--gateway-config", config,
                           "--api-port", str(api_port)],
                          env=dict(os.environ, BENCH_JOIN="bench-join"),
                          stderr=open(os.path.join(work, "gw.err"), "w"))
    browser = None
    subs = []
    status = 0
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                get(base, "/healthz")
                break
            except OSError:
                if gw.poll() is not None:
                    raise RuntimeError("the gateway exited; see %s/gw.err"
                                       % work)
                time.sleep(0.05)
        hist = get(base, "/v1/training/jobs/%s/history" % job)
        if hist["points"] != STEPS:
            raise RuntimeError("history has %d points" % hist["points"])
        browser = cdp.Browser()
        page = browser.page()
        job_ms, empty_ms = [], []
        for i in range(RUNS + 1):  # the first of each warms caches
            page.navigate("%s/?run=%d#/jobs/%s" % (base, i, job))
            ms = page.wait(
                "(() => { const m = performance.getEntriesByName("
                "'pcp-job-rendered'); return m.length ? m[0].startTime : 0; })()",
                60, "the job page")
            drawn = page.evaluate(
                "document.querySelector('#chart-loss polyline[data-series=loss]')"
                ".points.numberOfItems")
            if drawn != STEPS:
                raise RuntimeError("loss chart drew %s points" % drawn)
            page.navigate("%s/healthz?run=%d" % (base, i))
            e = page.wait(
                "(() => { const n = performance.getEntriesByType('navigation');"
                " return n.length && n[0].loadEventEnd > 0 && "
                "location.pathname === '/healthz' ? n[0].loadEventEnd : 0; })()",
                30, "the empty page")
            if i:
                job_ms.append(ms)
                empty_ms.append(e)
        # /healthz is JSON: the browser asks for /favicon.ico beside it
        # (404); the dashboard itself declares an inline icon.
        errors = [e for e in page.errors if "/favicon.ico" not in e]
        if errors:
            raise RuntimeError("console errors: %s" % errors[:3])
        page.navigate("about:blank")
        page.close()
        browser.close()
        browser = None
        job_med, empty_med = statistics.median(job_ms), statistics.median(empty_ms)
        print("job page of %d steps: median %.1f ms (runs %s)" % (
            STEPS, job_med, " ".join("%.0f" % v for v in job_ms)))
        print("empty page (/healthz): median %.1f ms (runs %s)" % (
            empty_med, " ".join("%.0f" % v for v in empty_ms)))

        # Events flow the whole time (EVENT_RATE/s written to the store by
        # `dashboard --append`); first no subscriber, then SUBSCRIBERS.
        writer = subprocess.Popen([self_path, "--append", state,
                                   str(EVENT_RATE),
                                   str(int(2 * WINDOW_S + 3))])
        time.sleep(0.5)
        idle = gateway_cpu_over(gw.pid, WINDOW_S)
        for _ in range(SUBSCRIBERS):
            subs.append(subscribe(api_port))
        time.sleep(0.5)
        received = [0]

        def drain():
            for s in subs:
                try:
                    while True:
                        chunk = s.recv(65536)
                        if not chunk:
                            break
                        received[0] += chunk.count(b"event: job")
                except BlockingIOError:
                    pass
        c0, t0 = cpu_seconds(gw.pid), time.monotonic()
        while time.monotonic() - t0 < WINDOW_S:
            drain()
            time.sleep(0.05)
        busy = (cpu_seconds(gw.pid) - c0) / (time.monotonic() - t0)
        writer.wait(30)
        per_sub_ms = max(0.0, busy - idle) / SUBSCRIBERS * 1000.0
        if received[0] < SUBSCRIBERS * EVENT_RATE * WINDOW_S * 0.5:
            raise RuntimeError("subscribers received only %d events" %
                               received[0])
        print("gateway CPU with %d job events/s: %.2f%% with no subscriber, "
              "%.2f%% with %d SSE subscribers (%d events delivered): %.3f ms "
              "CPU per subscriber per second" % (
                  EVENT_RATE, 100 * idle, 100 * busy, SUBSCRIBERS,
                  received[0], per_sub_ms))
        met_page = job_med <= GOAL_MS
        met_sse = per_sub_ms <= GOAL_SSE_CPU_MS
        print("dashboard goal job page of %d steps <= %.0f ms: %s" % (
            STEPS, GOAL_MS, "met" if met_page else "MISSED"))
        print("dashboard goal gateway CPU per SSE subscriber <= %.1f ms/s: %s"
              % (GOAL_SSE_CPU_MS, "met" if met_sse else "MISSED"))
        if os.environ.get("PCP_BENCH_CHECK") == "1" and not (met_page and
                                                              met_sse):
            status = 1
        print("dashboard ratio=%.4f" % (empty_med / job_med))
    finally:
        for s in subs:
            s.close()
        if browser:
            browser.close()
        gw.terminate()
        try:
            gw.wait(30)
        except subprocess.TimeoutExpired:
            gw.kill()
    return status


if __name__ == "__main__":
    sys.exit(main())
