#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The dashboard's RL view (issue 16, Deliver 6) in headless Chromium, from
a sample RL job JSON: a stdlib http.server serves the dashboard's own files
(src/roles/gateway/static, the bytes the gateway embeds) and answers the
API routes the pages read with one scripted RL job (the "rl" progress
object of docs/rl.md, "Running an RL job"), so the drawing is checked
without workers (the real job's page is exercised by the RL e2e's runs):

  1. the job page draws the reward curve: one reward_mean point per
     iteration, a +-std band around it (symmetric about the line, its
     half-width proportional to reward_std), eval_reward_mean only where
     present (as points, the base's at iteration 0 included), KL and clip
     fraction charts with one point per iteration (iteration 0's nulls
     skipped);
  2. the facts show iteration/num_iterations, reward mean +- std, eval
     reward, KL, clip fraction, tokens/s, the served model;
  3. the overview lists the job with its iteration progress;
  4. no console error or exception; a screenshot goes to the artifacts.
A missing chromium is a failure. Every wait is bounded.
"""
import http.server
import json
import os
import re
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cdp  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
STATIC = os.path.join(ROOT, "src", "roles", "gateway", "static")
ARTIFACTS = os.environ.get(
    "PCP_DASHBOARD_ARTIFACTS",
    os.path.join(ROOT, "build", "test-artifacts", "dashboard"))
FAILURES = []
POINTS = 12
EVAL_AT = (4, 8, 12)
EVAL_BASE = 0.02


def check(ok, what):
    print("%s: %s" % ("ok" if ok else "FAIL", what), flush=True)
    if not ok:
        FAILURES.append(what)


def sample_job():
    # Iteration 0 is the base model's evaluation (no rollouts yet: the
    # trainer's numbers are null), as the job publishes it.
    history = [{"iteration": 0, "reward_mean": None, "reward_std": None,
                "kl": None, "clip_fraction": None,
                "eval_reward_mean": EVAL_BASE}]
    for i in range(1, POINTS + 1):
        p = {"iteration": i, "reward_mean": 0.1 + 0.05 * i,
             "reward_std": 0.02 * (1 + i % 3), "kl": 0.0002 * i,
             "clip_fraction": 0.2 / i}
        if i in EVAL_AT:
            p["eval_reward_mean"] = 0.05 * i
        history.append(p)
    last = history[-1]
    now = int(time.time() * 1000)
    return {
        "job_id": "rl-sample", "kind": "rl", "state": "running",
        "attempt": 1, "created_at_ms": now - 60000, "updated_at_ms": now,
        "spec": {"experiment": {"name": "grpo-sample", "num_iterations": 20,
                                "group_size": 8, "beta": 0.04}},
        "rl": {"iteration": POINTS, "num_iterations": 20,
               "policy_version": POINTS, "served_model": "rl-sample-policy",
               "reward_mean": last["reward_mean"],
               "reward_std": last["reward_std"], "kl": last["kl"],
               "clip_fraction": last["clip_fraction"], "mean_ratio": 1.0,
               "loss": -0.05, "grad_norm": 0.7, "tokens_per_second": 1234.5,
               "rollout_tokens": 76800, "stale_dropped": 3,
               "degenerate_groups": 1, "truncated_tokens": 0,
               "weight_refresh_seconds": 0.25,
               "weight_refresh_bytes": 4 << 20,
               "eval_reward_mean": last["eval_reward_mean"],
               "checkpoint_iteration": 10, "history": history}}


class Fake:
    def __init__(self):
        job = sample_job()
        stop = self.stop = threading.Event()
        routes = {
            "/v1/jobs/rl-sample": job,
            "/v1/controller": {"gateway_id": "fake-gateway"},
            "/v1/workers": {"counts": {"connected": 0, "draining": 0,
                                       "lost": 0}, "workers": []},
            "/v1/models": {"object": "list", "data": []},
        }
        events = {"events": [
            {"event_id": 1, "job_id": "rl-sample", "type": "state",
             "from": "queued", "to": "running", "payload": {},
             "created_at_ms": job["created_at_ms"]},
            {"event_id": 2, "job_id": "rl-sample", "type": "rl.iteration",
             "payload": {"iteration": 1, "num_iterations": 20,
                         "reward_mean": 0.15, "reward_std": 0.04,
                         "kl": 0.001, "clip_fraction": 0.2,
                         "tokens_per_second": 1200.0,
                         "eval_reward_mean": None, "policy_version": 1},
             "created_at_ms": job["created_at_ms"] + 1000}], "more": False}
        files = {"/": ("dashboard.html", "text/html"),
                 "/dashboard.js": ("dashboard.js", "text/javascript"),
                 "/dashboard.css": ("dashboard.css", "text/css")}

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def send(self, code, data, kind):
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                path, _, query = self.path.partition("?")
                if path in files:
                    name, kind = files[path]
                    with open(os.path.join(STATIC, name), "rb") as f:
                        self.send(200, f.read(), kind)
                elif path == "/v1/events":
                    # An open stream with nothing in it, until the test ends.
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    self.wfile.write(b": open\n\n")
                    self.wfile.flush()
                    stop.wait(60)
                elif path == "/v1/jobs":
                    self.send(200, json.dumps({"jobs": [job]}).encode(),
                              "application/json")
                elif path == "/v1/jobs/rl-sample/events":
                    m = re.search(r"after=(\d+)", query)
                    after = int(m.group(1)) if m else 0
                    body = dict(events, events=[e for e in events["events"]
                                                if e["event_id"] > after])
                    self.send(200, json.dumps(body).encode(),
                              "application/json")
                elif path in routes:
                    self.send(200, json.dumps(routes[path]).encode(),
                              "application/json")
                else:
                    self.send(404, json.dumps({"error": {
                        "code": "NOT_FOUND", "message": path}}).encode(),
                        "application/json")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                      Handler)
        self.server.daemon_threads = True
        self.base = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.stop.set()
        self.server.shutdown()


def points(page, selector):
    """The "x,y" points of an SVG polyline or polygon, as float pairs."""
    text = page.evaluate("(() => { const e = document.querySelector(%s); "
                         "return e ? e.getAttribute('points') : null; })()"
                         % json.dumps(selector))
    if text is None:
        return None
    return [tuple(float(v) for v in p.split(",")) for p in text.split()]


def main():
    try:
        browser = cdp.Browser()
    except RuntimeError as e:
        print("FAIL: %s" % e, file=sys.stderr)
        return 1
    fake = Fake()
    os.makedirs(ARTIFACTS, exist_ok=True)
    page = None
    job = sample_job()
    history = [p for p in job["rl"]["history"] if p["iteration"] > 0]
    try:
        page = browser.page()
        page.navigate(fake.base + "/#/jobs/rl-sample")
        page.wait("document.body.dataset.rendered === 'job:rl-sample'", 30,
                  "the RL job page")
        # 1. The reward curve.
        line = points(page, "#chart-reward polyline[data-series=reward_mean]")
        band = points(page, "#chart-reward polygon[data-series=reward_std]")
        evals = points(page,
                       "#chart-reward polyline[data-series=eval_reward_mean]")
        check(line is not None and len(line) == POINTS,
              "reward_mean draws %s points for %d iterations"
              % (line and len(line), POINTS))
        check(band is not None and len(band) == 2 * POINTS,
              "the +-std band has %s vertices (2 x %d)"
              % (band and len(band), POINTS))
        if line and band and len(band) == 2 * POINTS:
            upper, lower = band[:POINTS], list(reversed(band[POINTS:]))
            sym = all(abs(u[0] - m[0]) < 0.11 and abs(l[0] - m[0]) < 0.11 and
                      abs((m[1] - u[1]) - (l[1] - m[1])) < 0.25
                      for u, m, l in zip(upper, line, lower))
            check(sym, "the band is symmetric about the line")
            # Half-widths in pixels over reward_std: one scale for all.
            ratios = [(l[1] - u[1]) / 2 / p["reward_std"]
                      for u, l, p in zip(upper, lower, history)]
            check(min(ratios) > 0 and max(ratios) / min(ratios) < 1.05,
                  "band half-width proportional to reward_std: %s"
                  % [round(r, 1) for r in ratios])
            # Higher reward is higher on the screen (SVG y grows down).
            check(line[-1][1] < line[0][1], "the rising reward rises")
        check(evals is not None and len(evals) == len(EVAL_AT) + 1,
              "eval_reward_mean: %s points for %d evaluations (the base's "
              "at iteration 0 included)"
              % (evals and len(evals), len(EVAL_AT) + 1))
        dots = page.evaluate("document.querySelectorAll('#chart-reward "
                             "circle').length")
        check(dots == len(EVAL_AT) + 1, "eval points drawn as dots: %s"
              % dots)
        for chart in ("chart-kl", "chart-clip"):
            n = page.evaluate("document.querySelector('#%s polyline')"
                              ".points.numberOfItems" % chart)
            check(n == POINTS, "%s draws %s points" % (chart, n))
        # KL is small (here 2e-4 .. 2.4e-3): its tick labels stay distinct.
        kl_ticks = page.evaluate("[...document.querySelectorAll('#chart-kl "
                                 ".tick.y')].map(t => t.textContent)")
        check(len(kl_ticks) >= 3 and len(set(kl_ticks)) == len(kl_ticks),
              "KL tick labels are distinct: %s" % kl_ticks)
        head = page.evaluate("document.querySelector('#charts-section h2')"
                             ".textContent")
        check(head == "RL curves", "section title: %r" % head)
        # 2. The facts.
        facts = page.evaluate("document.getElementById('job-facts')"
                              ".textContent")
        for want in ("12 / 20 iterations (60%)", "0.7000 \u00b1 0.0200",
                     "eval reward mean0.6000", "KL0.00240",
                     "clip fraction0.0167", "rollout tokens/s1235",
                     "rl-sample-policy", "stale rollouts dropped3",
                     "250 ms for 4.00 MiB"):
            check(want in facts, "facts show %r" % want)
        title = page.evaluate("document.getElementById('job-title')"
                              ".textContent")
        check(title == "grpo-sample (rl)", "title: %r" % title)
        config = page.evaluate("document.getElementById('job-config')"
                               ".textContent")
        check("group_size" in config, "the experiment is shown")
        timeline = page.wait(
            "(() => { const l = [...document.querySelectorAll("
            "'#timeline li.event')].map(l => l.textContent);"
            " return l.length === 2 ? l : null; })()", 20, "the timeline")
        check("iteration 1/20  reward 0.150 \u00b1 0.040  KL 0.0010  clip "
              "0.200  1200 tok/s  policy v1" in timeline[1],
              "an rl.iteration event reads as a line: %r" % timeline[1])
        check(page.screenshot(os.path.join(ARTIFACTS, "rl-job.png")) > 10000,
              "RL job page screenshot")
        page.pump(0.3)
        check(not page.errors, "job page: no console errors: %s" % page.errors)
        del page.errors[:]
        # 3. The overview's progress column.
        page.evaluate("location.hash = '#/'")
        row = page.wait("(() => { const r = document.querySelector("
                        "'tr[data-job=rl-sample]'); return r ? "
                        "[...r.children].map(td => td.textContent) : null; "
                        "})()", 20, "the overview's job row")
        check(row[1] == "rl" and row[3] == "12/20",
              "overview: kind rl, progress 12/20: %s" % row)
        page.pump(0.3)
        check(not page.errors, "overview: no console errors: %s" % page.errors)
    except (RuntimeError, TimeoutError, OSError, KeyError, TypeError) as e:
        check(False, "dashboard RL test: %s: %s" % (type(e).__name__, e))
        if page:
            try:
                page.screenshot(os.path.join(ARTIFACTS, "rl-failure.png"))
            except (RuntimeError, OSError):
                pass
    finally:
        if page:
            page.close()
        browser.close()
        fake.close()
    if FAILURES:
        print("%d failure(s)" % len(FAILURES), file=sys.stderr)
        return 1
    print("dashboard RL test passed; screenshot in %s" % ARTIFACTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
