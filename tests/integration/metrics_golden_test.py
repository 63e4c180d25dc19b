#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Every /metrics of a small real deployment against the golden list
(issue 18): a `pcp --gateway` serving a toy GPT, a `pcp --node-manager
--scale 2 --worker-metrics-port P` whose two CPU workers serve their own
/metrics, all on 127.0.0.1.

  1. two completions in one session (the second reuses the first's prefix
     from the slot's KV cache) and a DiLoCo job, cancelled once its series
     were seen;
  2. each body passes `promtool check metrics` (its one accepted finding:
     the colon in the vllm:* names, which vLLM's own /metrics has too);
  3. the (server, name, type, labels) seen equal tests/data/
     metrics_golden.txt both ways;
  4. values that could be wrong are checked: finished_reason counts, KV
     usage in (0, 1], prefix hits from the session, prefix queries equal
     prompt tokens, worker tasks / bytes / program cache lookups, process_*
     and pcp_build_info per role, target="default" everywhere;
  5. the training job's {job} series (loss, val loss, tokens/s, learning
     rate) exist while it runs and are gone after it ends (cancelled).

usage: metrics_golden_test.py PCP [--print]  (--print: write the observed
list to stdout, to review a change to the golden file by hand)
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import inference_models as im  # noqa: E402
import promtool_lint  # noqa: E402

PCP = sys.argv[1] if len(sys.argv) > 1 else os.environ["PCP_BINARY"]
PRINT = "--print" in sys.argv
GOLDEN = os.path.join(ROOT, "tests", "data", "metrics_golden.txt")
DATA = os.path.join(ROOT, "data", "tiny_shakespeare.txt")
JOIN = "metrics-join"
FAILURES = []
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_pair():
    """P with P and P+1 both free now."""
    for _ in range(50):
        p = free_port()
        if p >= 65535:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


def get(url, timeout=10):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def post(url, body, headers=None):
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 method="POST", headers=h)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def wait_for(pred, seconds, what):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            v = pred()
            if v:
                return v
        except OSError:
            pass
        time.sleep(0.1)
    check(False, "timed out: " + what)
    return None


def parse(text):
    """{name: type}, [(name, {label: value}, value)] of an exposition."""
    types, samples = {}, []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            if not m:
                check(False, "unparsable sample line %r" % line)
                continue
            labels = dict(LABEL.findall(m.group(3) or ""))
            samples.append((m.group(1), labels, float(m.group(4))))
    return types, samples


def family_of(sample_name, types):
    if sample_name in types:
        return sample_name
    for suffix in ("_bucket", "_sum", "_count"):
        base = sample_name[:-len(suffix)]
        if sample_name.endswith(suffix) and types.get(base) == "histogram":
            return base
    return None


def value(samples, name, **labels):
    """Sum of |name|'s samples whose labels include |labels|."""
    return sum(v for n, ls, v in samples if n == name and
               all(ls.get(k) == w for k, w in labels.items()))


def main():
    promtool = shutil.which("promtool")
    if not promtool:
        check(False, "promtool is installed (`make setup` installs the "
              "Debian package prometheus)")
        return
    work = tempfile.mkdtemp(prefix="pcp-metrics-")
    procs = []
    ok = False
    try:
        tables = os.path.join(work, "tables")
        os.makedirs(tables)
        gpt = im.Model(PCP, tables, im.GPT, 21)
        api, fabric = free_port(), free_port()
        worker_port = free_port_pair()
        nm_port = free_port()
        base = "http://127.0.0.1:%d" % api
        config = os.path.join(work, "gateway.json")
        roots = [os.path.join(ROOT, "data"), work]
        with open(config, "w") as f:
            json.dump({"gateway_id": "gw-metrics", "lab_id": "lab",
                       "state_dir": os.path.join(work, "state"),
                       "data_roots": roots, "model_roots": roots,
                       "worker_fabric": {"host": "127.0.0.1", "port": fabric,
                                         "join_token_env": "METRICS_JOIN",
                                         "heartbeat_ms": 1000}}, f)
        env = dict(os.environ, METRICS_JOIN=JOIN, PCP_WORKER_JOIN_TOKEN=JOIN)
        procs.append(subprocess.Popen(
            [PCP, "--gateway", "--gateway-config", config, "--api-port",
             str(api), "--model-dir", gpt.dir], env=env,
            stderr=open(os.path.join(work, "gateway.err"), "w")))
        procs.append(subprocess.Popen(
            [PCP, "--node-manager", "--scale", "2", "--host", "127.0.0.1",
             "--port", str(fabric), "--backend", "cpu", "--api-port",
             str(nm_port), "--worker-metrics-port", str(worker_port),
             "--start-stagger-ms", "100"], env=env,
            stderr=open(os.path.join(work, "nm.err"), "w")))
        servers = {
            "gateway": base,
            "node-manager": "http://127.0.0.1:%d" % nm_port,
            "worker0": "http://127.0.0.1:%d" % worker_port,
            "worker1": "http://127.0.0.1:%d" % (worker_port + 1),
        }
        if not wait_for(lambda: get(base + "/readyz")[0] == 200, 400,
                        "gateway ready (inference probe passed)"):
            return

        # 1a. Inference: the second request of the session finds the
        # first's prompt in its slot.
        session = {"X-Session-Id": "golden-session"}
        s1, r1 = post(base + "/v1/completions", {
            "model": "gpt-char", "prompt": "hello world", "max_tokens": 6,
            "temperature": 0}, session)
        s2, r2 = post(base + "/v1/completions", {
            "model": "gpt-char", "prompt": "hello world and more",
            "max_tokens": 4, "temperature": 0}, session)
        check(s1 == 200 and s2 == 200, "two completions: %s %s" % (s1, s2))

        # 1b. Training: its {job} series while it runs, then a cancel.
        experiment = {
            "name": "metrics-golden",
            "model": {"kind": "gpt", "layers": 1, "heads": 2, "kv_heads": 2,
                      "width": 32,
                      "vocab": 65, "block_size": 16, "batch": 2},
            "data_path": DATA, "tokenizer": "char", "sampling": "random",
            "learning_rate": 0.003, "tau": 2, "outer_loop_steps": 100000,
            "eval_every": 1, "eval_batches": 2, "seed": 1}
        st, job = post(base + "/v1/training/jobs", experiment)
        check(st == 202, "training job accepted: %s %s" % (st, job))
        job_id = job.get("job_id") if isinstance(job, dict) else None
        seen = {}  # server -> (types, samples) accumulated over scrapes

        def scrape(server):
            status, text = get(servers[server] + "/metrics")
            check(status == 200, "%s /metrics 200" % server)
            problems = promtool_lint.problems(promtool, text)
            check(problems is None, "promtool check metrics on %s: %s" %
                  (server, problems))
            types, samples = parse(text)
            old = seen.setdefault(server, ({}, []))
            old[0].update(types)
            old[1].extend(samples)
            return types, samples

        per_job = ("pcp_training_loss", "pcp_training_val_loss",
                   "pcp_training_tokens_per_second",
                   "pcp_training_learning_rate")

        def job_series():
            _, samples = parse(get(base + "/metrics")[1])
            got = {s[0]: s[2] for s in samples if s[0] in per_job and
                   s[1].get("job") == job_id}
            return got if len(got) == len(per_job) else None

        running = wait_for(job_series, 300,
                           "every {job} series while the job runs")
        check(bool(running) and all(0 < v < 1e9 for k, v in running.items()
                                    if k != "pcp_training_learning_rate"),
              "loss, val loss, tokens/s, lr {job=%s} while it runs: %s" %
              (job_id, running))
        scrape("gateway")

        # The job cannot end on its own before it was seen (100000 steps; a
        # short one can finish between two scrapes): cancel it now.
        sc, rc = post(base + "/v1/jobs/%s/cancel" % job_id, {})
        check(sc in (200, 202), "cancel accepted: %s %s" % (sc, rc))

        def job_state():
            _, r = get(base + "/v1/training/jobs/%s" % job_id)
            r = json.loads(r)
            return r.get("state") in ("succeeded", "failed", "cancelled") \
                and r.get("state")
        state = wait_for(job_state, 120, "training job ended")
        check(state == "cancelled", "training job cancelled: %s" % state)

        # 2. + 3. Every server, promtool, golden list.
        final = {name: scrape(name) for name in servers}
        _, gw_samples = final["gateway"]
        leftover = [(n, l) for n, l, _ in gw_samples
                    if l.get("job") == job_id]
        check(not leftover, "the ended job's series are gone: %s" % leftover)

        observed = set()
        unlabelled_seen = []
        for server, (types, samples) in sorted(seen.items()):
            role = "worker" if server.startswith("worker") else server
            labels = {}
            for name, ls, _ in samples:
                fam = family_of(name, types)
                check(fam is not None, "%s: sample %s has a TYPE" %
                      (server, name))
                if fam:
                    labels.setdefault(fam, set()).update(
                        k for k in ls if k != "le")
            for name, kind in types.items():
                if name not in labels:
                    unlabelled_seen.append("%s %s" % (role, name))
                observed.add((role, name, kind,
                              ",".join(sorted(labels.get(name, ())))
                              if name in labels else "?"))
        if PRINT:
            for row in sorted(observed):
                print("%s %s %s %s" % (row[0], row[1], row[2], row[3] or "-"))
        golden = set()
        with open(GOLDEN) as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#"):
                    role, name, kind, labels = line.split()
                    golden.add((role, name, kind,
                                "" if labels == "-" else labels))
        # A family with no sample in any scrape shows its name and type
        # only: its labels are compared where they were seen.
        def key(row):
            return row[:3]
        golden_by_key = {key(g): g for g in golden}
        observed_by_key = {key(o): o for o in observed}
        missing = sorted(set(golden_by_key) - set(observed_by_key))
        extra = sorted(set(observed_by_key) - set(golden_by_key))
        check(not missing, "golden metrics not exposed: %s" % missing)
        check(not extra, "exposed metrics not in the golden list "
              "(tests/data/metrics_golden.txt): %s" % extra)
        wrong = [(observed_by_key[k], golden_by_key[k][3])
                 for k in observed_by_key if k in golden_by_key and
                 observed_by_key[k][3] != "?" and
                 observed_by_key[k][3] != golden_by_key[k][3]]
        check(not wrong, "labels differ from the golden list: %s" % wrong)
        print("families without samples (labels not compared): %s" %
              sorted(unlabelled_seen), flush=True)

        # 4. Values.
        _, nm_samples = final["node-manager"]
        w_samples = final["worker0"][1] + final["worker1"][1]
        check(value(gw_samples, "vllm:request_success_total",
                    model_name="gpt-char", finished_reason="length") == 2,
              "two requests ended by length")
        prompt = value(gw_samples, "vllm:prompt_tokens_total",
                       model_name="gpt-char")
        queries = value(gw_samples, "vllm:prefix_cache_queries_total",
                        model_name="gpt-char")
        hits = value(gw_samples, "vllm:prefix_cache_hits_total",
                     model_name="gpt-char")
        check(prompt == len("hello world") + len("hello world and more") and
              queries == prompt,
              "prefix cache queries %s = prompt tokens %s" % (queries, prompt))
        check(hits == len("hello world"),
              "the session's second prompt reused 'hello world': hits %s" %
              hits)
        kv = value(gw_samples, "vllm:kv_cache_usage_perc",
                   model_name="gpt-char")
        # The two requests left 11+6 and 20+4 tokens in slots of 96 (4
        # slots per runner), one or two runners.
        check(0 < kv <= 1, "KV cache usage in (0, 1]: %s" % kv)
        check(value(gw_samples, "vllm:generation_tokens_total",
                    model_name="gpt-char") == 10, "10 tokens generated")
        check(value(w_samples, "pcp_worker_tasks_total",
                    outcome="succeeded") > 0, "workers ran tasks")
        check(value(w_samples, "pcp_worker_received_bytes_total") > 0 and
              value(w_samples, "pcp_worker_sent_bytes_total") > 0,
              "workers counted fabric bytes")
        check(value(w_samples, "pcp_worker_program_cache_hits_total") +
              value(w_samples, "pcp_worker_program_cache_misses_total") > 0,
              "workers counted program offers")
        check(value(w_samples, "pcp_worker_session_bytes") > 0,
              "workers hold session tensors")
        for server, (types, samples) in final.items():
            role = "worker" if server.startswith("worker") else server
            # An idle node manager may not have used 10 ms of CPU yet.
            busy = server != "node-manager"
            cpu = value(samples, "process_cpu_seconds_total")
            start = value(samples, "process_start_time_seconds")
            check((cpu > 0 if busy else cpu >= 0) and
                  value(samples, "process_resident_memory_bytes") > 0 and
                  value(samples, "process_open_fds") > 0 and
                  value(samples, "process_max_fds") >=
                  value(samples, "process_open_fds") and
                  time.time() - 3600 < start <= time.time() + 1,
                  "%s process_* read from /proc (cpu %s, start %s)" %
                  (server, cpu, start))
            check(value(samples, "pcp_build_info", role=role) == 1,
                  "%s pcp_build_info{role=%s} 1" % (server, role))
            targets = {ls["target"] for _, ls, _ in samples if "target" in ls}
            check(targets <= {"default"},
                  "%s: target label values %s" % (server, targets))
        check(value(gw_samples, "pcp_fabric_workers", state="connected",
                    backend="cpu", target="default") +
              value(gw_samples, "pcp_fabric_workers", state="busy",
                    backend="cpu", target="default") == 2,
              "the fabric counts both workers with target=\"default\"")
        check(value(nm_samples, "pcp_node_manager_info", backend="cpu",
                    target="default") == 1, "node manager target=\"default\"")
        ok = not FAILURES
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("logs kept in %s" % work)


if __name__ == "__main__":
    main()
    if FAILURES:
        print("%d failure(s)" % len(FAILURES))
        sys.exit(1)
    print("metrics golden: all checks passed")
