#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The operator dashboard (issue 18) in headless Chromium over the DevTools
protocol, against a real `pcp --gateway` (API token on) and
`pcp --node-manager --scale 2` CPU workers training a short real DiLoCo job
(real IREE):

  1. without a token every page says 401 plainly; the token typed into the
     "API token" field (sessionStorage) opens them;
  2. the overview lists both workers (short names, the full id on hover),
     and while the job trains a worker shows a current task and in-flight
     work (the fabric's own counts, from /v1/workers) and tasks done grow;
  3. the job page: the loss chart draws exactly as many points as the job
     has outer steps (= /v1/training/jobs/{id}/history points = the job's
     distinct training.step events), the val_loss series one point per
     evaluation, the log toggle and wheel zoom work, the timeline and the
     configuration are there;
  4. the models page lists the exported model with its request count,
     TTFT and tokens/s after one completion through the OpenAI API;
  5. the cancel button (two clicks) cancels a running job: its state turns
     cancelled through the API;
  6. no page logs a console error or throws; screenshots of every page go
     to build/test-artifacts/dashboard/;
  7. the gateway SIGKILLed and restarted: the page shows "reconnecting",
     then "live" again, and lists a job submitted after the restart.
A missing chromium is a failure. Every wait is bounded.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cdp  # noqa: E402
import gateway_test as gt  # noqa: E402
from gateway_test import check, request, wait_for  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
DATA = os.path.join(ROOT, "data", "tiny_shakespeare.txt")
ARTIFACTS = os.environ.get(
    "PCP_DASHBOARD_ARTIFACTS",
    os.path.join(ROOT, "build", "test-artifacts", "dashboard"))
STEPS = 6


def experiment(steps, **extra):
    # Small enough to compile and train in seconds on 2 shared cores.
    e = {"name": "dash-char",
         "model": {"kind": "gpt", "layers": 1, "heads": 4, "width": 64,
                   "vocab": 65, "block_size": 32, "batch": 8},
         "data_path": DATA, "tokenizer": "char", "sampling": "random",
         "learning_rate": 0.003, "tau": 2, "outer_loop_steps": steps,
         "eval_fraction": 0.1, "eval_every": 2, "eval_batches": 2,
         "checkpoint_every": steps, "seed": 1}
    e.update(extra)
    return e


def start_cluster(work):
    api_port, fabric_port = gt.free_port(), gt.free_port()
    gt.BASE = "http://127.0.0.1:%d" % api_port
    gw = gt.Gateway(work, api_port, fabric_port)
    with open(gw.config) as f:
        config = json.load(f)
    config["worker_fabric"]["heartbeat_ms"] = 1000
    config["data_roots"] = [os.path.join(ROOT, "data")]
    with open(gw.config, "w") as f:
        json.dump(config, f)
    gw.start()
    env = dict(os.environ, PCP_WORKER_JOIN_TOKEN=gt.JOIN)
    nm = subprocess.Popen(
        [gt.PCP, "--node-manager", "--scale", "2", "--host", "127.0.0.1",
         "--port", str(fabric_port), "--backend", "cpu", "--api-port", "0"],
        env=env, stderr=open(os.path.join(work, "nm.err"), "w"))
    check(wait_for(lambda: request("GET", "/v1/workers")[1]["counts"][
        "connected"] == 2, 60, "two workers joined"), "two workers joined")
    return gw, nm


def state_of(job_id):
    s, r = request("GET", "/v1/jobs/%s" % job_id)
    return r.get("state") if s == 200 else None


def submit(body):
    s, r = request("POST", "/v1/training/jobs", body)
    check(s == 202, "training job accepted: %s %s" % (s, r))
    return r.get("job_id")


def no_errors(page, what):
    page.pump(0.3)
    check(not page.errors, "%s: no console errors: %s" % (what, page.errors))
    del page.errors[:]


def main():
    if not os.path.exists(DATA):
        print("FAIL: no %s" % DATA, file=sys.stderr)
        return 1
    try:
        browser = cdp.Browser()
    except RuntimeError as e:
        print("FAIL: %s" % e, file=sys.stderr)
        return 1
    work = tempfile.mkdtemp(prefix="pcp-dash-")
    os.makedirs(ARTIFACTS, exist_ok=True)
    gw = nm = None
    page = None
    try:
        gw, nm = start_cluster(work)
        page = browser.page()

        # 1. No token: a clear 401 on the page (the failed loads are the
        # point here, so they are not counted as errors).
        page.navigate(gt.BASE + "/")
        text = page.wait("document.getElementById('status').className === "
                         "'error' && document.getElementById('status')"
                         ".textContent", 20, "the 401 message")
        check("401" in text and "token" in text, "401 said plainly: " + text)
        check(page.screenshot(os.path.join(ARTIFACTS, "unauthorized.png"))
              > 5000, "401 screenshot")
        del page.errors[:]
        page.type_text("#token", gt.TOKEN)
        page.click("#token-form button[type=submit]")
        page.wait("document.querySelectorAll('tr.worker').length === 2",
                  20, "two worker rows")
        check(page.evaluate("sessionStorage.getItem('pcp.token')") == gt.TOKEN,
              "token kept in sessionStorage")
        page.navigate(gt.BASE + "/#/")  # a fresh load with the stored token
        page.wait("document.querySelectorAll('tr.worker').length === 2",
                  20, "two worker rows after reload")
        no_errors(page, "overview")

        # 2. While training: a worker shows its current task; the fabric
        # counts its in-flight work. The job starts only now (a job started
        # before the page loads can finish, programs cached, before the
        # first poll), and tau 40 makes a round last long enough (~0.1 s)
        # to be seen at a 50 ms poll.
        job = submit(experiment(STEPS, tau=40))
        saw_task = saw_in_flight = False
        deadline = time.time() + 90
        while time.time() < deadline and not (saw_task and saw_in_flight):
            s, w = request("GET", "/v1/workers")
            for x in w.get("workers", []):
                saw_in_flight = saw_in_flight or x.get("in_flight", 0) > 0
                saw_task = saw_task or x.get("current_task") is not None
            if state_of(job) in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.05)
        check(saw_in_flight and saw_task,
              "a training worker shows in-flight work and a current task "
              "(in_flight>0: %s, current_task: %s)" % (saw_in_flight, saw_task))
        names = page.evaluate(
            "[...document.querySelectorAll('tr.worker td:first-child')]"
            ".map(td => [td.textContent, td.title])")
        check(len(names) == 2 and all(t and len(t) < len(full) and full
                                      for t, full in names),
              "short worker names with the full id on hover: %s" % names)
        check(page.evaluate("!!document.querySelector('tr[data-job=\"%s\"]')"
                            % job), "the job is listed on the overview")
        check(wait_for(lambda: state_of(job) == "succeeded", 240,
                       "training job succeeded"), "training job succeeded")
        s, w = request("GET", "/v1/workers")
        done = sum(x.get("tasks_done", 0) for x in w["workers"])
        check(done >= 2 * STEPS, "tasks_done counts the rounds: %d" % done)
        page.wait("[...document.querySelectorAll('tr[data-job]')].some(r => "
                  "r.textContent.includes('succeeded'))", 20,
                  "the overview shows the job succeeded (live)")
        check(page.screenshot(os.path.join(ARTIFACTS, "overview.png")) > 10000,
              "overview screenshot")

        # 3. The job page.
        s, hist = request("GET", "/v1/training/jobs/%s/history" % job)
        check(s == 200 and hist["points"] == STEPS and
              hist["outer_step"] == list(range(1, STEPS + 1)),
              "history has one point per outer step: %s" % hist)
        s, evs = request("GET", "/v1/jobs/%s/events" % job)
        step_events = {e["payload"]["outer_step"] for e in evs["events"]
                       if e["type"] == "training.step"}
        vals = [v for v in hist["val_loss"] if v is not None]
        page.evaluate("location.hash = '#/jobs/%s'" % job)
        page.wait("document.body.dataset.rendered === 'job:%s'" % job, 20,
                  "the job page")
        drawn = page.evaluate(
            "document.querySelector('#chart-loss polyline[data-series=loss]')"
            ".points.numberOfItems")
        check(drawn == STEPS == len(step_events),
              "loss chart draws %s points for %d steps (%d step events)" %
              (drawn, STEPS, len(step_events)))
        drawn_val = page.evaluate(
            "document.querySelector('#chart-loss polyline[data-series=val_loss]')"
            ".points.numberOfItems")
        check(len(vals) >= 1 and drawn_val == len(vals),
              "val_loss chart draws %s points for %d evaluations" %
              (drawn_val, len(vals)))
        ticks = page.evaluate("[document.querySelectorAll('#chart-loss "
                              ".tick.x').length, document.querySelectorAll("
                              "'#chart-loss .tick.y').length]")
        check(ticks[0] >= 3 and ticks[1] >= 3, "loss axes have ticks: %s" % ticks)
        for chart in ("chart-tokens", "chart-wire"):
            n = page.evaluate("document.querySelector('#%s polyline')"
                              ".points.numberOfItems" % chart)
            check(n == STEPS, "%s draws %s points" % (chart, n))
        check(page.screenshot(os.path.join(ARTIFACTS, "job.png")) > 10000,
              "job page screenshot")
        page.click("#chart-loss .log-toggle")
        check("(log)" in page.evaluate("document.querySelector('#chart-loss "
                                       ".y-label').textContent"),
              "log scale toggled")
        page.wheel("#chart-loss svg", -400)
        page.wheel("#chart-loss svg", -400)
        zoomed = page.evaluate(
            "document.querySelector('#chart-loss polyline[data-series=loss]')"
            ".points.numberOfItems")
        check(0 < zoomed < STEPS, "wheel zoom narrows the loss chart: %s" % zoomed)
        count_tokens = ("document.querySelector('#chart-tokens polyline')"
                        ".points.numberOfItems")
        # A drag over the last half of the tokens/s chart's plot (its x
        # axis is time: the first step, compiling, is far left).
        page.drag("#chart-tokens svg", 0.5, 0.99)
        dragged = page.evaluate(count_tokens)
        check(0 < dragged < STEPS, "drag zoom narrows the tokens/s chart: %s"
              % dragged)
        page.double_click("#chart-tokens svg")
        check(page.evaluate(count_tokens) == STEPS,
              "double-click resets the zoom")
        timeline = page.evaluate("[...document.querySelectorAll("
                                 "'#timeline li.event')].map(l => l.textContent)")
        check(any("running" in t for t in timeline) and
              any("outer step %d" % STEPS in t for t in timeline) and
              not any("{" in t for t in timeline),
              "readable timeline: %s" % timeline[:4])
        check("tau" in page.evaluate("document.getElementById('job-config')"
                                     ".textContent"), "experiment shown")
        check(page.screenshot(os.path.join(ARTIFACTS, "job-zoomed-log.png"))
              > 10000, "zoomed job page screenshot")
        no_errors(page, "job page")

        # 4. Models: the export is served; one completion moves the stats.
        model = wait_for(lambda: next((m for m in request("GET", "/v1/models")
                                       [1].get("data", []) if m["id"] ==
                                       "dash-char" and m["status"] == "ready"),
                                      None), 120, "the export is served")
        s, r = request("POST", "/v1/completions", {
            "model": "dash-char", "prompt": "RO", "max_tokens": 4,
            "temperature": 0}, timeout=120)
        check(s == 200, "one completion: %s %s" % (s, r))
        page.evaluate("location.hash = '#/models'")
        page.wait("document.body.dataset.view === 'models' && "
                  "!!document.querySelector('tr.model[data-model=dash-char]')",
                  20, "the models page")
        row = page.wait(
            "(() => { const r = document.querySelector("
            "'tr.model[data-model=dash-char]'); const c = r ? "
            "[...r.children].map(td => td.textContent) : null; "
            "return c && c[4] === '1' ? c : null; })()", 20,
            "the model's request count")
        check(model is not None and row[1] == "ready" and row[5] != "-" and
              row[6] != "-", "models row with TTFT and tokens/s: %s" % row)
        check(page.screenshot(os.path.join(ARTIFACTS, "models.png")) > 5000,
              "models screenshot")
        no_errors(page, "models page")

        # 5. Cancel from the overview.
        # Long enough to outlast the clicks: since the training service waits
        # on fabric events instead of polling (issue 14), 1,000 steps of
        # this model finish in about 40 s, inside this part's windows.
        long_job = submit(experiment(100000, name="dash-long"))
        check(wait_for(lambda: state_of(long_job) == "running", 60,
                       "long job running"), "long job running")
        page.evaluate("location.hash = '#/'")
        sel = "button.cancel[data-job=\"%s\"]" % long_job
        page.wait("!!document.querySelector(%s)" % json.dumps(sel), 20,
                  "the cancel button")
        # While it trains, the overview shows a worker's current task.
        task = page.wait(
            "(() => { const c = [...document.querySelectorAll("
            "'tr.worker td.running')].map(td => td.textContent); "
            "return c.length ? c : null; })()", 30,
            "a worker's current task on the overview")
        check(any("#" in t for t in task), "current task shown: %s" % task)
        check(page.screenshot(os.path.join(ARTIFACTS, "overview-training.png"))
              > 10000, "overview screenshot while training")
        page.click(sel)
        check(page.evaluate("document.querySelector(%s).textContent"
                            % json.dumps(sel)) == "confirm cancel",
              "first click asks to confirm")
        page.click(sel)
        check(wait_for(lambda: state_of(long_job) == "cancelled", 60,
                       "cancelled through the button"),
              "the cancel button cancels the job")
        page.wait("[...document.querySelectorAll('tr[data-job]')].some(r => "
                  "r.dataset.job === %s && r.textContent.includes('cancelled'))"
                  % json.dumps(long_job), 20, "the overview shows cancelled")
        check(page.evaluate("document.getElementById('live').textContent")
              == "live", "the event stream is live")
        check(page.screenshot(os.path.join(ARTIFACTS, "overview-cancelled.png"))
              > 10000, "overview screenshot after cancel")
        no_errors(page, "overview after cancel")

        # 7. Reconnect: the gateway is SIGKILLed and started again on the
        # same state; the page says "reconnecting", then "live" again, and
        # a job submitted after the restart appears without a reload.
        gw.proc.kill()
        gw.proc.wait()
        page.wait("document.getElementById('live').textContent === "
                  "'reconnecting'", 20, "the page notices the outage")
        gw.start()
        page.wait("document.getElementById('live').textContent === 'live'",
                  30, "the event stream reconnects")
        # The outage's failed loads are expected; what follows is not.
        page.pump(0.5)
        del page.errors[:]
        after = submit(experiment(2, name="dash-after-restart"))
        page.wait("!!document.querySelector('tr[data-job=\"%s\"]')" % after,
                  20, "a job submitted after the restart is listed")
        wait_for(lambda: state_of(after) in ("succeeded", "failed",
                                             "cancelled"), 120,
                 "the post-restart job ends")
        no_errors(page, "overview after the reconnect")
    except (RuntimeError, TimeoutError, OSError, KeyError, TypeError) as e:
        check(False, "dashboard test: %s: %s" % (type(e).__name__, e))
        if page:
            try:
                page.screenshot(os.path.join(ARTIFACTS, "failure.png"))
            except (RuntimeError, OSError):
                pass
    finally:
        if page:
            page.close()
        browser.close()
        for proc in (nm, gw.proc if gw else None):
            if proc:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    if gt.FAILURES:
        print("%d failure(s); logs in %s" % (len(gt.FAILURES), work),
              file=sys.stderr)
        return 1
    print("dashboard test passed; screenshots in %s" % ARTIFACTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
