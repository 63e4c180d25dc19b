#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 15 item 6, the federation with real processes on 127.0.0.1: one
`pcp --federation-hub` and three `pcp --gateway`s, each with a node manager
running CPU workers (real IREE: one each on A and B, B's joined with
--target host, two on C), federation heartbeat 500 ms.

  1. registration and peers: the hub lists the three gateways connected,
     each with its training service and its available CPU workers (C has
     2, so it ranks first); every gateway's /v1/federation/peers lists all
     three;
  2. a gateway with the wrong federation token is refused by the hub
     (its status says UNAUTHENTICATED) and never registered;
     staleness: a job needing 2 workers lands on C; C (and its workers) is
     SIGKILLed; the hub marks it stale within 3 intervals (+ one poll of
     slack); a placement naming it is refused, unnamed placements go to A
     or B although C would rank first, and workers_required 2 is refused;
  3. a training job placed through the hub (smallest model, 2 rounds) runs
     to success on A or B; its lookup goes through the hub (global job id ->
     the gateway's child job); a second, long job is cancelled through the
     hub and ends cancelled on its gateway; workers_required 2 (no gateway
     has 2) is refused, not placed; target_arch "host" (only B's workers
     joined with it) places on B, "sm_80" is refused;
  4. the hub is SIGKILLed and restarted on the same state dir: the
     registrations and global jobs are still there, the gateways reconnect
     on their own (backoff), a new global job id is never one used before;
  5. gateway C restarts and is connected again.
Every wait is bounded. Logs stay in the work dir on failure.
"""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import federation_cluster as fc  # noqa: E402

PCP = sys.argv[1] if len(sys.argv) > 1 else os.environ["PCP_BINARY"]
HEARTBEAT_MS = 500
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, file=sys.stderr)
    return cond


def experiment(name, steps):
    return {"name": name,
            "model": {"kind": "gpt", "layers": 1, "heads": 2, "kv_heads": 2,
                      "width": 32, "vocab": 65, "block_size": 16,
                      "batch": 4},
            "data_path": os.path.join(fc.ROOT, "data",
                                      "tiny_shakespeare.txt"),
            "tokenizer": "char", "learning_rate": 0.01, "tau": 2,
            "outer_loop_steps": steps, "checkpoint_every": 1000, "seed": 3}


def hub_gateways(hub):
    s, body = hub.call("GET", "/v1/federation/peers")
    if s != 200:
        return {}
    return {g["gateway_id"]: g for g in body.get("gateways", [])}


def child_state(job):
    child = job.get("child") or {}
    return child.get("state")


def registration(hub, gateways):
    ok = fc.wait_until(lambda: all(
        g.get("status") == "connected"
        for g in hub_gateways(hub).values()) and
        len(hub_gateways(hub)) == 3, 10)
    check(ok, "three gateways connected at the hub: %s" % hub_gateways(hub))
    # Counts arrive once each worker joined (the next connect after).
    def training_counts():
        out = {}
        for gid, g in hub_gateways(hub).items():
            t = [s for s in g.get("services", [])
                 if s.get("service_type") == "training"]
            out[gid] = t[0].get("workers_available") if t else None
        return out
    # gw-b's workers joined with --target host: only its advertisement
    # carries a target_arch.
    targets = {gid: [s.get("target_arch") for s in g.get("services", [])
                     if s.get("service_type") == "training"]
               for gid, g in hub_gateways(hub).items()}
    check(targets == {"gw-a": [None], "gw-b": ["host"], "gw-c": [None]},
          "target_arch per gateway: %s" % targets)
    want = {"gw-a": 1, "gw-b": 1, "gw-c": 2}
    counts = fc.wait_until(lambda: training_counts() == want, 5)
    check(counts, "each gateway advertises its available CPU workers: %s" %
          training_counts())
    for gw in gateways:
        ids = fc.wait_until(lambda: sorted(
            p["gateway_id"] for p in gw.call("GET", "/v1/federation/peers")[1]
            ["gateways"]) == ["gw-a", "gw-b", "gw-c"], 5)
        check(ids, "%s sees all three peers" % gw.gateway_id)
        s, st = gw.call("GET", "/v1/federation/status")
        check(s == 200 and st.get("connected") and st.get("peer_count") == 3,
              "%s status connected: %s" % (gw.gateway_id, st))


def wrong_token(cluster, hub):
    """A gateway with the wrong federation credential is refused by the
    hub, says so in its status, and is never registered."""
    gw = cluster.gateway("gw-x", token_value="not-the-secret")
    st = fc.wait_until(lambda: (lambda b: b if b.get("consecutive_failures",
                                                     0) >= 1 else None)(
        gw.call("GET", "/v1/federation/status")[1]), 5)
    check(st and st.get("status") == "disconnected" and
          "UNAUTHENTICATED" in (st.get("last_error") or ""),
          "wrong federation token: the hub refuses, the status says so: %s"
          % st)
    check("gw-x" not in hub_gateways(hub),
          "a gateway with the wrong token is never registered")
    gw.terminate()
    cluster.gateways.remove(gw)


def staleness(hub, gw_c):
    # C is the best candidate while alive (2 workers; placement ranks by
    # workers available): a job needing 2 workers lands there.
    s, job = hub.call("POST", "/v1/training/jobs",
                      {"placement": {"workers_required": 2},
                       "job": experiment("pre-kill", 100000)})
    check(s == 202 and job.get("assignment", {}).get("gateway_id") == "gw-c",
          "workers_required 2 places on gw-c while it is alive: %s %s" %
          (s, job))
    t0 = time.time()
    gw_c.kill()
    stale_at = fc.wait_until(
        lambda: hub_gateways(hub).get("gw-c", {}).get("status") == "stale"
        and time.time(), 10, 0.05)
    took = (stale_at - t0) if stale_at else None
    print("gw-c stale after %s s (3 intervals = %.1f s)" %
          (took and "%.2f" % took, 3 * HEARTBEAT_MS / 1000))
    # Its last connect was at most one interval before the kill; stale
    # strictly after 3 intervals from it; one poll period of slack.
    check(took is not None and took <= 3 * HEARTBEAT_MS / 1000 + 0.6,
          "a SIGKILLed gateway is stale within 3 intervals: %s" % took)
    others = hub_gateways(hub)
    check(others.get("gw-a", {}).get("status") == "connected" and
          others.get("gw-b", {}).get("status") == "connected",
          "the others stay connected")
    s, body = hub.call("POST", "/v1/training/jobs",
                       {"placement": {"gateway_id": "gw-c"},
                        "job": experiment("to-stale", 2)})
    check(400 <= s < 600 and s != 202 and "error" in body,
          "placement naming the stale gateway is refused: %s %s" % (s, body))


def jobs_through_hub(hub, gateways):
    by_id = {g.gateway_id: g for g in gateways}
    s, job = hub.call("POST", "/v1/training/jobs",
                      {"placement": {}, "job": experiment("fed-ok", 2)})
    if not check(s == 202 and job.get("global_job_id"),
                 "training job placed through the hub: %s %s" % (s, job)):
        return []
    gid = job["global_job_id"]
    a = job.get("assignment", {})
    # gw-c (2 workers) would rank first if it were not stale.
    check(a.get("gateway_id") in ("gw-a", "gw-b") and a.get("child_job_id"),
          "placed on a live gateway, never the stale one: %s" % a)
    # The child exists on that gateway, under the id the hub recorded.
    gw = by_id.get(a.get("gateway_id"))
    if gw:
        s, child = gw.call("GET", "/v1/jobs/" + a.get("child_job_id", "x"))
        check(s == 200 and child.get("kind") == "training",
              "the child job is on %s: %s" % (gw.gateway_id, s))
    # Lookup through the hub until the child finishes.
    final = fc.wait_until(lambda: (lambda r: r[1] if r[0] == 200 and
                                   child_state(r[1]) in
                                   ("succeeded", "failed", "cancelled")
                                   else None)(
        hub.call("GET", "/v1/jobs/" + gid)), 150, 0.5)
    print("global job %s on %s: child %s %s" % (
        gid, a.get("gateway_id"), a.get("child_job_id"),
        final and child_state(final)))
    check(final and child_state(final) == "succeeded",
          "the job ran to success, seen through the hub: %s" %
          (final and final.get("child", {}).get("error")))

    # Placement by target: no gateway has sm_80 workers; gw-b's are "host".
    s, body = hub.call("POST", "/v1/training/jobs",
                       {"placement": {"target_arch": "sm_80"},
                        "job": experiment("no-target", 2)})
    check(s != 202 and "error" in body,
          "no gateway with target sm_80: refused: %s %s" % (s, body))
    # A long job placed by target (so on gw-b), cancelled through the hub.
    other = "gw-b"
    s, long_job = hub.call("POST", "/v1/training/jobs",
                           {"placement": {"target_arch": "host"},
                            "job": experiment("fed-cancel", 100000)})
    ids = [gid]
    if check(s == 202 and long_job.get("global_job_id"),
             "long job placed on %s: %s %s" % (other, s, long_job)):
        lid = long_job["global_job_id"]
        ids.append(lid)
        check(long_job.get("assignment", {}).get("gateway_id") == other,
              "placement by target_arch lands on the gateway whose workers "
              "have it: %s" % long_job.get("assignment"))
        fc.wait_until(lambda: child_state(hub.call(
            "GET", "/v1/jobs/" + lid)[1]) == "running", 60, 0.3)
        s, c = hub.call("POST", "/v1/jobs/%s/cancel" % lid)
        check(s in (200, 202), "cancel through the hub: %s %s" % (s, c))
        done = fc.wait_until(lambda: child_state(hub.call(
            "GET", "/v1/jobs/" + lid)[1]) == "cancelled", 60, 0.3)
        print("global job %s cancelled through the hub: %s" % (lid, bool(done)))
        check(done, "the long job ends cancelled: %s" %
              hub.call("GET", "/v1/jobs/" + lid)[1])
        child_id = long_job.get("assignment", {}).get("child_job_id", "x")
        s, child = by_id[other].call("GET", "/v1/jobs/" + child_id)
        check(child.get("state") == "cancelled",
              "cancelled on the gateway itself: %s" % child.get("state"))
    # workers_required filters (upstream only ranked by it): only the stale
    # gateway has 2 workers.
    s, body = hub.call("POST", "/v1/training/jobs",
                       {"placement": {"workers_required": 2},
                        "job": experiment("too-big", 2)})
    check(s != 202 and "error" in body,
          "workers_required 2 with only 1-worker gateways live is refused: "
          "%s %s" % (s, body))
    return ids


def hub_restart(hub, gateways, job_ids):
    before = {g.gateway_id: g.call("GET", "/v1/federation/status")[1]
              .get("connect_count", 0) for g in gateways}
    hub.kill()
    # The gateways notice and back off.
    fc.wait_until(lambda: all(
        g.call("GET", "/v1/federation/status")[1].get("status") ==
        "disconnected" for g in gateways), 5)
    time.sleep(1.0)
    hub.start()
    # Registrations survived: listed (stale or connected) right away.
    s, body = hub.call("GET", "/v1/federation/peers")
    ids = sorted(g["gateway_id"] for g in body.get("gateways", []))
    check(ids == ["gw-a", "gw-b", "gw-c"],
          "registrations survive the hub's SIGKILL: %s" % ids)
    for gid in job_ids:
        s, job = hub.call("GET", "/v1/jobs/" + gid)
        check(s == 200 and job.get("global_job_id") == gid,
              "global job %s survives the restart: %s" % (gid, s))
    # The live gateways reconnect by themselves (backoff cap 4 s).
    ok = fc.wait_until(lambda: all(
        hub_gateways(hub).get(g.gateway_id, {}).get("status") == "connected"
        for g in gateways), 10)
    check(ok, "gateways reconnect after the hub restart: %s" %
          {k: v.get("status") for k, v in hub_gateways(hub).items()})
    for g in gateways:
        s, st = g.call("GET", "/v1/federation/status")
        check(st.get("connected") and
              st.get("connect_count", 0) > before[g.gateway_id],
              "%s reconnected: %s" % (g.gateway_id, st))
    # Global job numbers are never reused.
    s, job = hub.call("POST", "/v1/training/jobs",
                      {"placement": {}, "job": experiment("after", 1)})
    new_id = job.get("global_job_id") if s == 202 else None
    check(new_id and new_id not in job_ids,
          "a new global job id after the restart: %s (had %s)" %
          (new_id, job_ids))
    if new_id:
        s, c = hub.call("POST", "/v1/jobs/%s/cancel" % new_id)


def main():
    work = tempfile.mkdtemp(prefix="pcp-federation-")
    cluster = fc.Cluster(PCP, work, heartbeat_ms=HEARTBEAT_MS)
    t0 = time.time()
    try:
        hub = cluster.hub()
        gateways = [cluster.gateway("gw-a", workers=1),
                    cluster.gateway("gw-b", workers=1, target="host"),
                    cluster.gateway("gw-c", workers=2)]
        print("cluster up in %.1f s" % (time.time() - t0))
        registration(hub, gateways)
        wrong_token(cluster, hub)
        staleness(hub, gateways[2])
        job_ids = jobs_through_hub(hub, gateways[:2])
        hub_restart(hub, gateways[:2], job_ids)
        # 5. C comes back.
        gateways[2].start()
        ok = fc.wait_until(lambda: hub_gateways(hub).get("gw-c", {})
                           .get("status") == "connected", 5)
        check(ok, "a stale gateway recovers on its next connect")
    except Exception as e:  # noqa: BLE001 - report, then tear down
        check(False, "exception: %r" % e)
    finally:
        cluster.stop()
    print("federation_test: %.1f s" % (time.time() - t0))
    if FAILURES:
        print("federation_test: %d failures (logs in %s)" %
              (len(FAILURES), work))
        return 1
    print("federation_test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
