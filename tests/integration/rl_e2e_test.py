#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 16 Deliver 7's end-to-end GRPO run: a small built-in model learns a
verifiable target and its held-out reward rises.

A real `pcp --gateway` and two real `pcp --worker`s (CPU, IREE) on
127.0.0.1 (rl_cluster.py):
  1. a short DiLoCo job trains the base model (a char GPT of ~110k
     parameters on data/tiny_shakespeare.txt, ~60 s);
  2. POST /v1/rl/jobs refusals: 400 naming the key (unknown key, a value
     out of range), 403 for a prompts path outside the roots, 404 for a
     train_job that does not exist;
  3. the GRPO job: base_model {"train_job": <id>, "spec": ...}, prompts
     "<SPEAKER>:\\n" (16 names, 8 per iteration, 8 samples each, 32 new
     tokens), reward `contains "!"` (the base model writes "!" in ~7% of
     32-character completions: rare, not zero); 8 held-out speakers
     evaluated before the first update and every 5 iterations (8 samples
     each at temperature 1 with a fixed seed: the same draws each time);
  4. asserted: the job succeeds; the base evaluation is <= 0.30 and the
     final one >= base + 0.25 (the margin); the final policy's completions
     are not degenerate (>= 15 distinct characters over the held-out
     completions, no character above 40% of them); the progress JSON has
     every published key, one history point per iteration and a
     checkpoint at the end; one rl.iteration event per iteration, and
     GET /v1/events streams them; the
     pcp_rl_* metrics; the final policy is served under its name (listed by
     /v1/models with outer_step = the last version, chat answers);
  5. a second, long job is cancelled mid-run: cancelled within 3 s;
  6. the other base model forms: the training job's served directory and
     its safetensors file run one iteration each; a safetensors file with no
     model.json beside it is a 400;
  7. an external verifier (http.server on 127.0.0.1) scores a job's
     rollouts; one answering 500 fails its job with that message; a prompt
     too long for the block fails its job naming the prompt.
The reward curve is printed.

usage: rl_e2e_test.py PCP
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rl_cluster as rc  # noqa: E402
from rl_cluster import check  # noqa: E402

PCP = sys.argv[1] if len(sys.argv) > 1 else os.environ["PCP_BINARY"]
ITERATIONS = int(os.environ.get("PCP_RL_E2E_ITERATIONS", "20"))
# The margin the held-out reward must rise by, and the base's ceiling.
MARGIN = 0.25
BASE_CEILING = 0.30


def experiment(job_id, prompts, eval_prompts, **extra):
    e = {"num_iterations": ITERATIONS, "group_size": 8, "num_prompts": 8,
         "rollout_max_tokens": 32, "learning_rate": 3e-3, "beta": 0.04,
         "clip_eps": 0.2, "temperature": 1.0, "max_off_policy_steps": 1,
         "prompts_path": prompts, "eval_prompts_path": eval_prompts,
         "eval_every": 5, "checkpoint_every": 5, "seed": 1,
         "reward": {"type": "contains", "text": "!"},
         "base_model": {"train_job": job_id, "spec": rc.SPEC},
         "served_model_name": "rl-e2e"}
    # Exploration hook: PCP_RL_E2E_EXTRA='{"learning_rate": 0.01}'.
    e.update(json.loads(os.environ.get("PCP_RL_E2E_EXTRA", "{}")))
    e.update(extra)
    return e


def error_message(body):
    return body.get("error", {}).get("message", "")


def refusals(c, job_id, prompts, eval_prompts):
    base = experiment(job_id, prompts, eval_prompts)
    cases = [
        (dict(base, num_iteration=3), 400, "num_iteration: unknown key"),
        (dict(base, group_size=1), 400, "group_size: must be in [2, 1024]"),
        (dict(base, served_model_name="a/b"), 400, "served_model_name"),
        (dict(base, prompts_path="/etc/passwd"), 403, "prompts_path"),
        (dict(base, base_model={"train_job": "train-nope", "spec": rc.SPEC}),
         404, "base_model.train_job: no job 'train-nope'"),
    ]
    for body, code, text in cases:
        status, answer = c.request("POST", "/v1/rl/jobs", body)
        check(status == code and text in error_message(answer),
              "POST /v1/rl/jobs refused %d naming %r: %s %s" %
              (code, text, status, error_message(answer)))


def progress_line(rl):
    return ("iteration %s/%s version %s reward %.3f +- %.3f kl %.4f clip %.3f "
            "loss %.4f tok/s %.0f eval %s stale %s refresh %.2fs" % (
                rl.get("iteration"), rl.get("num_iterations"),
                rl.get("policy_version"), rl.get("reward_mean") or 0,
                rl.get("reward_std") or 0, rl.get("kl") or 0,
                rl.get("clip_fraction") or 0, rl.get("loss") or 0,
                rl.get("tokens_per_second") or 0, rl.get("eval_reward_mean"),
                rl.get("stale_dropped"),
                rl.get("weight_refresh_seconds") or 0))


def main():
    work = tempfile.mkdtemp(prefix="pcp-rl-e2e-")
    c = rc.Cluster(PCP, work)
    t0 = time.time()
    ok = False
    try:
        if not c.gateway_start() or not c.workers_start(2):
            return False
        train_job = c.train_base()
        if not train_job:
            return False
        t_trained = time.time()
        prompts, eval_prompts = c.prompts_write()
        refusals(c, train_job, prompts, eval_prompts)

        status, job = c.request("POST", "/v1/rl/jobs",
                                experiment(train_job, prompts, eval_prompts))
        check(status == 202 and job.get("kind") == "rl" and
              job.get("rl", {}).get("iteration") == 0 and
              job.get("rl", {}).get("num_iterations") == ITERATIONS,
              "rl job accepted (202, kind rl, iteration 0): %s %s" %
              (status, {k: job.get(k) for k in ("job_id", "kind", "state")}))
        job_id = job.get("job_id")
        if not job_id:
            return False
        last_line = None
        deadline = time.time() + 900
        body = {}
        while time.time() < deadline:
            _, body = c.request("GET", "/v1/rl/jobs/%s" % job_id)
            rl = body.get("rl") or {}
            if rl.get("iteration") is not None and rl.get("reward_mean"):
                line = progress_line(rl)
                if line != last_line:
                    print("  " + line, flush=True)
                    last_line = line
            if body.get("state") in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.5)
        t_rl = time.time()
        check(body.get("state") == "succeeded",
              "rl job succeeded in %.0f s: %s %s" %
              (t_rl - t_trained, body.get("state"), body.get("error")))
        rl = body.get("rl") or {}
        history = rl.get("history") or []
        print("reward curve (iteration, reward mean, std, kl, clip, eval):")
        for p in history:
            print("  %3d  %s  %s  %s  %s  %s" % (
                p["iteration"], fmt(p.get("reward_mean")),
                fmt(p.get("reward_std")), fmt(p.get("kl")),
                fmt(p.get("clip_fraction")), fmt(p.get("eval_reward_mean"))))
        evals = [(p["iteration"], p["eval_reward_mean"]) for p in history
                 if p.get("eval_reward_mean") is not None]
        check(len(evals) >= 2 and evals[0][0] == 0 and
              evals[-1][0] == ITERATIONS,
              "evaluations before the first update and at the end: %s" %
              evals)
        if len(evals) >= 2:
            base, final = evals[0][1], evals[-1][1]
            check(base <= BASE_CEILING,
                  "base held-out reward %.3f <= %.2f (rare)" %
                  (base, BASE_CEILING))
            check(final >= base + MARGIN,
                  "held-out reward rose by >= %.2f: %.3f -> %.3f (+%.3f)" %
                  (MARGIN, base, final, final - base))
        keys = ["iteration", "num_iterations", "policy_version",
                "served_model", "reward_mean", "reward_std", "kl",
                "clip_fraction", "mean_ratio", "loss", "grad_norm",
                "tokens_per_second", "rollout_tokens", "stale_dropped",
                "degenerate_groups", "truncated_tokens",
                "weight_refresh_seconds", "weight_refresh_bytes",
                "eval_reward_mean", "checkpoint_iteration", "history"]
        check(all(k in rl for k in keys) and
              rl.get("iteration") == ITERATIONS and
              rl.get("checkpoint_iteration") == ITERATIONS and
              rl.get("served_model") == "rl-e2e" and
              rl.get("rollout_tokens", 0) > 0 and
              rl.get("weight_refresh_bytes", 0) > 0,
              "progress JSON: every key, iteration %s, checkpoint %s, "
              "served_model %s" % (rl.get("iteration"),
                                   rl.get("checkpoint_iteration"),
                                   rl.get("served_model")))
        check(len([p for p in history if p["iteration"] > 0]) == ITERATIONS,
              "one history point per iteration")
        version = rl.get("policy_version")
        check(version == ITERATIONS - rl.get("skipped_updates", 0),
              "policy version %s = iterations - skipped updates" % version)

        _, events = c.request("GET", "/v1/jobs/%s/events" % job_id)
        iteration_events = [e for e in events.get("events", [])
                            if e.get("type") == "rl.iteration"]
        check(len(iteration_events) == ITERATIONS,
              "one rl.iteration event per iteration: %d" %
              len(iteration_events))

        check(sse_sees_iteration(c, job_id),
              "GET /v1/events streams the job's rl.iteration events")

        metrics = metrics_text(c)
        for name in ("pcp_rl_iterations_total", "pcp_rl_reward_mean",
                     "pcp_rl_rollout_tokens_total",
                     "pcp_rl_stale_rollouts_dropped_total"):
            check(re.search(r'^%s\{job="%s"\} ' % (name, job_id), metrics,
                            re.M) is not None, "metric %s{job}" % name)
        m = re.search(r'^pcp_rl_iterations_total\{job="%s"\} (\S+)' % job_id,
                      metrics, re.M)
        check(m and float(m.group(1)) == ITERATIONS,
              "pcp_rl_iterations_total = %d" % ITERATIONS)
        check("pcp_rl_weight_refresh_seconds_count" in metrics,
              "pcp_rl_weight_refresh_seconds histogram")

        # The final policy is served like a trained model.
        _, models = c.request("GET", "/v1/models")
        served = [m for m in models.get("data", []) if m.get("id") == "rl-e2e"]
        check(served and served[0].get("outer_step") == version and
              served[0].get("job_id") == job_id,
              "/v1/models lists rl-e2e at outer_step %s of %s: %s" %
              (version, job_id, served))
        status, chat = c.request("POST", "/v1/chat/completions", {
            "model": "rl-e2e", "max_tokens": 16,
            "messages": [{"role": "user", "content": "ROMEO:"}]})
        check(status == 200 and chat.get("choices"),
              "chat with the final policy: %s" % status)
        degenerate_check(c)
        cancel_check(c, train_job, prompts, eval_prompts)
        base_forms_check(c, train_job, prompts, eval_prompts)
        verifier_check(c, train_job, prompts, eval_prompts)
        length_check(c, train_job, eval_prompts)
        submit_cli_check(c, train_job, prompts, eval_prompts)
        ok = True
        print("wall time: %.0f s (training %.0f s, rl %.0f s)" %
              (time.time() - t0, t_trained - t0, t_rl - t_trained))
    finally:
        c.stop()
        if rc.FAILURES or not ok:
            print("logs kept in", work)
            c.logs()
        else:
            rc.remove(work)
    return ok and not rc.FAILURES


def submit_cli_check(c, train_job, prompts, eval_prompts):
    # `pcp submit rl` follows a real job to its end (its control flow against
    # a scripted server is integration_submit_rl; this is the real gateway).
    path = os.path.join(c.work, "exp_cli.json")
    with open(path, "w") as f:
        json.dump(experiment(train_job, prompts, eval_prompts,
                             num_iterations=2, eval_every=1,
                             checkpoint_every=2, served_model_name="rl-cli"),
                  f)
    r = subprocess.run([PCP, "submit", "rl", path, "--gateway", c.base,
                        "--poll-ms", "200"],
                       capture_output=True, text=True, timeout=600)
    check(r.returncode == 0 and "iter 2/2" in r.stdout and
          " succeeded" in r.stdout,
          "pcp submit rl follows a real job: rc %d: %s %s" %
          (r.returncode, r.stdout[-400:], r.stderr[-400:]))


def cancel_check(c, train_job, prompts, eval_prompts):
    """A cancel stops a running job within ~1 s (rollouts, trainer and the
    serve wait all take the job's stop flag)."""
    status, job = c.request("POST", "/v1/rl/jobs", experiment(
        train_job, prompts, eval_prompts, num_iterations=100000,
        eval_prompts_path=None, eval_every=None, checkpoint_every=1000,
        served_model_name="rl-cancel"))
    job_id = job.get("job_id")
    check(status == 202 and job_id, "a long rl job accepted: %s" % status)
    if not job_id:
        return
    rc.wait_for(lambda: (c.request("GET", "/v1/rl/jobs/%s" % job_id)[1]
                         .get("rl") or {}).get("iteration", 0) >= 2, 300,
                "the long job's second iteration", interval=0.1)
    t0 = time.time()
    status, _ = c.request("POST", "/v1/jobs/%s/cancel" % job_id)
    done = rc.wait_for(lambda: c.request("GET", "/v1/jobs/%s" % job_id)[1]
                       .get("state") == "cancelled", 30, "cancelled",
                       interval=0.05)
    seconds = time.time() - t0
    check(status in (200, 202) and done and seconds <= 3.0,
          "cancel of a running rl job: cancelled in %.2f s (<= 3 s on this "
          "shared machine; ~1 s asked)" % seconds)


def sse_sees_iteration(c, job_id):
    """The SSE stream from the start (Last-Event-ID: 0) carries an
    rl.iteration event of |job_id|."""
    import urllib.request
    req = urllib.request.Request(c.base + "/v1/events",
                                 headers={"Last-Event-ID": "0"})
    deadline = time.time() + 30
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            while time.time() < deadline:
                line = r.readline().decode(errors="replace")
                if not line:
                    return False
                if (line.startswith("data:") and '"rl.iteration"' in line
                        and job_id in line):
                    return True
    except OSError:
        return False
    return False


def base_forms_check(c, train_job, prompts, eval_prompts):
    """The other two base model forms: the training job's served directory
    and its safetensors file (model.json beside it), one iteration each;
    and a safetensors file without a model.json beside it refused."""
    export = os.path.join(c.state, "models", train_job)
    lone = os.path.join(c.state, "models", "lone")
    os.makedirs(lone, exist_ok=True)
    with open(os.path.join(export, "model.safetensors"), "rb") as f:
        weights = f.read()
    with open(os.path.join(lone, "model.safetensors"), "wb") as f:
        f.write(weights)
    status, answer = c.request("POST", "/v1/rl/jobs", experiment(
        train_job, prompts, eval_prompts,
        base_model={"safetensors": os.path.join(lone, "model.safetensors")}))
    check(status == 400 and "no model.json" in error_message(answer),
          "a safetensors base without model.json beside it: 400: %s %s" %
          (status, error_message(answer)))
    for name, base in (("dir", {"served_model_dir": export}),
                       ("st", {"safetensors": os.path.join(
                           export, "model.safetensors")})):
        status, job = c.request("POST", "/v1/rl/jobs", experiment(
            train_job, prompts, eval_prompts, num_iterations=1,
            eval_prompts_path=None, eval_every=None, base_model=base,
            served_model_name="rl-form-" + name))
        job_id = job.get("job_id")
        done = job_id and rc.wait_for(
            lambda: c.request("GET", "/v1/rl/jobs/%s" % job_id)[1].get(
                "state") in ("succeeded", "failed", "cancelled"), 300,
            "the %s job" % name, interval=0.2)
        _, body = c.request("GET", "/v1/rl/jobs/%s" % (job_id or "x"))
        check(status == 202 and done and body.get("state") == "succeeded" and
              (body.get("rl") or {}).get("policy_version") == 1,
              "base_model %s: one iteration succeeded: %s %s" %
              (list(base)[0], body.get("state"), body.get("error")))


def job_end(c, job_id, what):
    rc.wait_for(lambda: c.request("GET", "/v1/rl/jobs/%s" % job_id)[1].get(
        "state") in ("succeeded", "failed", "cancelled"), 300, what,
        interval=0.2)
    return c.request("GET", "/v1/rl/jobs/%s" % job_id)[1]


def verifier_check(c, train_job, prompts, eval_prompts):
    """An external verifier (a real HTTP server on 127.0.0.1) scores the
    rollouts of a job; one that answers 500 fails its job with the
    verifier's message, never a silent zero."""
    import http.server
    import threading
    seen = {"items": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(
                int(self.headers["Content-Length"])))
            if self.path == "/fail":
                data = b'{"error": "scripted failure"}'
                self.send_response(500)
            else:
                items = body["items"]
                seen["items"] += len(items)
                data = json.dumps({"rewards": [
                    1.0 if "!" in i["completion"] else 0.0
                    for i in items]}).encode()
                self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = "http://127.0.0.1:%d" % server.server_address[1]
    try:
        for path, want in (("/score", "succeeded"), ("/fail", "failed")):
            status, job = c.request("POST", "/v1/rl/jobs", experiment(
                train_job, prompts, eval_prompts, num_iterations=1,
                eval_prompts_path=None, eval_every=None,
                served_model_name="rl-verifier",
                reward={"type": "verifier", "url": url + path,
                        "max_retries": 0, "timeout_ms": 10000}))
            body = job_end(c, job.get("job_id", "x"), "the verifier job")
            error = body.get("error") or ""
            check(status == 202 and body.get("state") == want and
                  (want == "succeeded" or "HTTP 500" in error),
                  "external verifier %s: job %s (%s)" %
                  (path, body.get("state"), error[:160]))
        check(seen["items"] == 64, "the verifier scored the iteration's 64 "
              "rollouts: %d" % seen["items"])
    finally:
        server.shutdown()


def length_check(c, train_job, eval_prompts):
    """A prompt that with rollout_max_tokens does not fit the block fails
    the job with a message naming it."""
    path = os.path.join(c.data, "long.jsonl")
    with open(path, "w") as f:
        f.write(json.dumps({"prompt": "A short one:\n"}) + "\n")
        f.write(json.dumps({"prompt": "x" * 40}) + "\n")
    status, job = c.request("POST", "/v1/rl/jobs", experiment(
        train_job, path, eval_prompts, num_iterations=1,
        eval_prompts_path=None, eval_every=None, served_model_name="rl-long"))
    body = job_end(c, job.get("job_id", "x"), "the long-prompt job")
    error = body.get("error") or ""
    check(status == 202 and body.get("state") == "failed" and
          "prompt[1] is 40 tokens" in error and "block_size 64" in error,
          "a prompt of 40 tokens + 32 new > block 64 fails the job: %s" %
          error[:200])


def fmt(v):
    return "  -   " if v is None else "%.4f" % v


def metrics_text(c):
    import urllib.request
    try:
        with urllib.request.urlopen(c.base + "/metrics", timeout=30) as r:
            return r.read().decode()
    except OSError:
        return ""


def degenerate_check(c):
    """The final policy still writes text, not one character repeated."""
    texts = []
    for name in rc.EVAL_NAMES:
        for seed in range(4):
            status, body = c.request("POST", "/v1/completions", {
                "model": "rl-e2e", "prompt": name + ":\n", "max_tokens": 32,
                "temperature": 1.0, "seed": 100 + seed})
            if status == 200:
                texts.append(body["choices"][0]["text"])
    joined = "".join(texts)
    counts = {}
    for ch in joined:
        counts[ch] = counts.get(ch, 0) + 1
    top = max(counts.values()) / len(joined) if joined else 1.0
    print("final policy samples: %s" % [t for t in texts[:4]])
    check(len(texts) == 4 * len(rc.EVAL_NAMES) and len(counts) >= 15 and
          top <= 0.40,
          "completions not degenerate: %d distinct characters, the most "
          "common %.0f%% of %d" % (len(counts), 100 * top, len(joined)))


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
