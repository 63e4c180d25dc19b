#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`pcp --gateway` with two real `pcp --worker` processes (issue 4 gaps):

  1. service registration: upstream's worker-count normalisation
     (reference s.3.1.1), its defaults, and a JSON 400 naming the field for
     each bad one;
  2. /v1/workers lists every joined worker from the fabric's registry with
     the full record; /v1/workers/{id} from the same source; 404 JSON;
  3. a job with placement.workers = 2 runs on both workers (one result per
     worker, two distinct worker ids in the succeeded event);
  4. compiles do not block the queue: a job whose compile is slowed by the
     test hook stays `compiling` while a ready job is placed and finishes;
  5. a worker that leaves is listed as lost.
Helpers come from gateway_test.py. Every wait is bounded.
"""
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gateway_test as gt  # noqa: E402

from gateway_test import check, is_error, request, wait_for  # noqa: E402

SLOW_MS = 8000


def start_worker(work, fabric_port, device_id):
    env = dict(os.environ, PCP_WORKER_JOIN_TOKEN=gt.JOIN)
    # The worker id is derived from host, backend and device, so two
    # workers on one host differ by --device-id.
    name = "worker%d" % device_id
    err = open(os.path.join(work, name + ".err"), "a")
    return subprocess.Popen(
        [gt.PCP, "--worker", "--connect", "127.0.0.1:%d" % fabric_port,
         "--device-id", str(device_id),
         "--cache-dir", os.path.join(work, "cache-" + name)],
        env=env, stderr=err)


def services(expected_workers):
    reg = "/v1/services/register"
    base = {"service_id": "s", "service_type": "training",
            "base_url": "http://127.0.0.1:1"}

    def register(**fields):
        body = dict(base)
        body.update(fields)
        return request("POST", reg, body)

    # Normalisation, upstream's precedence and order.
    for fields, want in [
        ({"worker_count": 3, "workers_available": 1},
         {"worker_count": 3, "workers_connected": 3, "workers_ready": 1,
          "ready_worker_count": 1, "workers_available": 1,
          "workers_dispatchable": 1}),
        ({"workers_ready": 5},
         {"worker_count": 5, "workers_ready": 5, "ready_worker_count": 5,
          "workers_available": 5, "workers_dispatchable": 5}),
        ({"workers_ready": 2, "workers_available": 4},
         {"worker_count": 2, "workers_ready": 4, "ready_worker_count": 4,
          "workers_dispatchable": 4}),
        ({"workers_connected": 6, "worker_count": 1, "ready_worker_count": 2,
          "workers_dispatchable": 1},
         {"worker_count": 6, "workers_ready": 2, "ready_worker_count": 1}),
        ({}, {"worker_count": 0, "ready_worker_count": 0,
              "auth_mode": "none", "health_status": "ok",
              "job_status": "running", "capabilities": []}),
        ({"auth_mode": "bearer", "capabilities": ["diloco"],
          "max_workers": 8},
         {"auth_mode": "bearer", "capabilities": ["diloco"],
          "max_workers": 8}),
    ]:
        s, r = register(**fields)
        got = r.get("service", {}) if isinstance(r, dict) else {}
        bad = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
        check(s == 200 and not bad,
              "register %s: %s %s" % (fields, s, bad or r))
    # A 400 naming the field for each bad one.
    for fields, name in [
        ({"service_type": "bad type!"}, "service_type"),
        ({"service_type": "t" * 200}, "service_type"),
        ({"worker_count": -1}, "worker_count"),
        ({"workers_available": "3"}, "workers_available"),
        ({"workers_ready": 1.5}, "workers_ready"),
        ({"reserved_workers": -2}, "reserved_workers"),
        ({"capabilities": "x"}, "capabilities"),
        ({"capabilities": ["a", 1]}, "capabilities[1]"),
        ({"base_url": 5}, "base_url"),
        ({"auth_mode": 3}, "auth_mode"),
        ({"health_status": ["ok"]}, "health_status"),
        ({"executor_id": 7}, "executor_id"),
    ]:
        resp = register(**fields)
        check(is_error(resp, 400, "INVALID_ARGUMENT") and
              ("'%s'" % name) in resp[1]["error"]["message"],
              "register 400 naming %s: %s" % (name, resp))
    request("DELETE", "/v1/services/gw-test:training:s")


def main():
    work = tempfile.mkdtemp(prefix="pcp-gw2-")
    api_port, fabric_port = gt.free_port(), gt.free_port()
    gt.BASE = "http://127.0.0.1:%d" % api_port
    os.environ["PCP_GATEWAY_TEST_COMPILE_DELAY_MS"] = str(SLOW_MS)
    gw = gt.Gateway(work, api_port, fabric_port)
    procs = []
    try:
        gw.start()
        procs.append(gw.proc)
        services(2)

        # 2. /v1/workers from the fabric registry.
        check(is_error(request("GET", "/v1/workers/nobody"), 404,
                       "NOT_FOUND"), "unknown worker 404 JSON")
        s, w = request("GET", "/v1/workers")
        check(s == 200 and w["workers"] == [] and w["total"] == 0,
              "no workers yet: %s" % w)
        wa = start_worker(work, fabric_port, 0)
        wb = start_worker(work, fabric_port, 1)
        procs += [wa, wb]
        if not wait_for(lambda: request("GET", "/v1/workers")[1]["counts"][
                "connected"] == 2, 30, "two workers joined"):
            return 1
        s, w = request("GET", "/v1/workers")
        ids = [x["worker_id"] for x in w["workers"]]
        check(len(ids) == 2 and ids == sorted(set(ids)) and
              w["total"] == 2 and not w["truncated"],
              "both workers listed, by id: %s" % w)
        by_device = {x["device_id"]: x["worker_id"] for x in w["workers"]}
        check(sorted(by_device) == [0, 1], "device ids %s" % by_device)
        id_b = by_device.get(1, "")
        for x in w["workers"]:
            for key in ["state", "sched_state", "backend", "target",
                        "device_id", "device_memory_bytes", "drivers",
                        "runtime_version", "compiler_version",
                        "node_manager_id", "heartbeat_age_seconds",
                        "lease_id", "in_flight", "lease_epoch",
                        "join_count", "program_count", "bytes_from_worker",
                        "bytes_to_worker"]:
                check(key in x, "worker record has %s: %s" % (key, x))
            check(x["state"] == "connected" and x["backend"] == "cpu" and
                  isinstance(x["drivers"], list) and x["drivers"] and
                  x["runtime_version"] and x["heartbeat_age_seconds"] < 5,
                  "worker record values: %s" % x)
        s, one = request("GET", "/v1/workers/" + id_b)
        check(s == 200 and one["worker_id"] == id_b and one["device_id"] == 1,
              "worker get: %s" % one)

        # The fabric's byte counters of each link: the handshake and
        # heartbeats so far, growing with the job below (program, inputs
        # down; results up).
        bytes_before = {x["worker_id"]: (x["bytes_to_worker"],
                                         x["bytes_from_worker"])
                        for x in w["workers"]}
        check(all(isinstance(t, int) and isinstance(f, int) and t > 0 and
                  f > 0 for t, f in bytes_before.values()),
              "byte counters after the handshake: %s" % bytes_before)

        # 3. Two workers, one job: it runs on both.
        a = [1, 2, 3, 4, 5, 6]
        s, job = request("POST", "/v1/jobs", gt.job_body(
            a, [0.5] * 6, placement={"backend": "cpu", "workers": 2}))
        check(s == 202, "2-worker job accepted: %s" % job)
        jid = job["job_id"]
        wait_for(lambda: gt.job_state(jid) in ("succeeded", "failed"), 60,
                 "2-worker job finished")
        check(gt.job_state(jid) == "succeeded",
              "2-worker job succeeded: %s" % request("GET", "/v1/jobs/" + jid)[1])
        s, res = request("GET", "/v1/jobs/%s/results" % jid)
        names = sorted(r["name"] for r in res.get("results", []))
        check(names == ["w0.out0", "w1.out0"], "one result per worker %s" %
              names)
        after = {x["worker_id"]: (x["bytes_to_worker"], x["bytes_from_worker"])
                 for x in request("GET", "/v1/workers")[1]["workers"]}
        for wid, (to0, from0) in bytes_before.items():
            to1, from1 = after.get(wid, (0, 0))
            # Down: at least the program offer and the task; up: at least
            # the result (24 bytes of f32) with its frame.
            check(to1 > to0 + 100 and from1 > from0 + 24,
                  "worker %s byte counters grew with its task: %s -> %s"
                  % (wid, (to0, from0), (to1, from1)))
        want = [(x + 0.5) ** 2 for x in a]
        for name in names:
            s, raw, _ = request("GET", "/v1/jobs/%s/results/%s" % (jid, name),
                                raw=True)
            got = struct.unpack("<6f", raw) if len(raw) == 24 else ()
            check(s == 200 and len(got) == 6 and
                  all(abs(p - q) < 1e-5 for p, q in zip(got, want)),
                  "result %s: %s" % (name, got))
        # The final placement names the worker of each task, in result
        # order (w<i>.out<j> ran on workers[i]).
        s, j = request("GET", "/v1/jobs/" + jid)
        ran_on = (j.get("placement") or {}).get("workers", [])
        check(len(ran_on) == 2 and sorted(ran_on) == ids,
              "ran on two distinct workers: %s" % ran_on)

        # 4. A slow compile does not hold the queue.
        slow_mlir = "// pcp-test:slow-compile\n" + gt.ADD_MLIR.replace(
            "stablehlo.add", "stablehlo.subtract")
        s, slow = request("POST", "/v1/jobs", gt.job_body(
            a, [1.0] * 6, program={"format": "stablehlo", "text": slow_mlir}))
        sid = slow["job_id"]
        wait_for(lambda: gt.job_state(sid) == "compiling", 10,
                 "slow job compiling")
        t0 = time.time()
        s, fast = request("POST", "/v1/jobs", gt.job_body(a, [2.0] * 6))
        fid = fast["job_id"]
        wait_for(lambda: gt.job_state(fid) in ("succeeded", "failed"),
                 SLOW_MS / 1000.0, "ready job finished during the compile")
        check(gt.job_state(fid) == "succeeded" and
              gt.job_state(sid) == "compiling",
              "ready job placed while the other compiles: fast=%s slow=%s "
              "after %.1fs" % (gt.job_state(fid), gt.job_state(sid),
                               time.time() - t0))
        wait_for(lambda: gt.job_state(sid) in ("succeeded", "failed"),
                 SLOW_MS / 1000.0 + 60, "slow job finished")
        check(gt.job_state(sid) == "succeeded", "slow job succeeded")
        s, raw, _ = request("GET", "/v1/jobs/%s/results/out0" % sid, raw=True)
        got = struct.unpack("<6f", raw) if len(raw) == 24 else ()
        check(len(got) == 6 and all(abs(p - (x - 1.0) ** 2) < 1e-5
                                    for p, x in zip(got, a)),
              "slow job result %s" % (got,))

        # 5. A worker that leaves stays listed, as lost.
        wb.send_signal(signal.SIGKILL)
        wb.wait(timeout=10)
        wait_for(lambda: request("GET", "/v1/workers/" + id_b)[1].get(
            "state") == "lost", 10, "worker 1 lost")
        s, w = request("GET", "/v1/workers")
        states = {x["worker_id"]: x["state"] for x in w["workers"]}
        check(states == {by_device.get(0): "connected", id_b: "lost"},
              "lost worker still listed: %s" % states)
        lost = [x for x in w["workers"] if x["worker_id"] == id_b]
        check(lost and lost[0]["heartbeat_age_seconds"] is None and
              lost[0]["lost_at_ms"], "lost worker record: %s" % lost)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        if gt.FAILURES:
            for name in sorted(os.listdir(work)):
                if name.endswith(".err"):
                    with open(os.path.join(work, name)) as f:
                        sys.stderr.write("--- %s (tail)\n" % name)
                        sys.stderr.write(f.read()[-3000:])
        shutil.rmtree(work, ignore_errors=True)
    if gt.FAILURES:
        print("%d failure(s)" % len(gt.FAILURES), file=sys.stderr)
        return 1
    print("gateway workers test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
