#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 15, knowledge-graph replication with real processes on 127.0.0.1:
one `pcp --federation-hub` and two `pcp --gateway`s (A and B, no workers),
federation heartbeat 300 ms (the push runs after every connect).

  1. policies: nothing replicates until a namespace's policy allows it;
     PUT validates (400 naming the key) and is partial;
  2. on A: global and shared entities, a relation and an observation in an
     open namespace reach the hub; a local entity and a global one in a
     namespace without a policy never leave A (hub store counts, the hub's
     query and B's global query all agree); A's local query sees all;
  3. B's query modes: global answers A's replicated items only;
     local_plus_global puts B's own items first and de-duplicates by id
     (B's version of a shared id wins); an unknown mode is 400;
  4. event ingest on A: two events -> four mutations, idempotent on resend,
     400 naming the event for a bad one; they replicate too;
  5. the hub is SIGKILLed while A pushes 300 more mutations; B's global
     query answers 502 JSON meanwhile; after the restart the hub ends with
     exactly every eligible mutation once (counts compared before/after,
     mutation count == eligible count) and A's lag is 0;
  6. the hub's route refuses (nothing applied): an item no policy allows
     (409 PolicyRejected), an unregistered gateway (400 UnknownGateway), a
     bad visibility, a missing through_sequence_no, the client token (403);
  7. a policy revoked on A reaches the hub, which stops answering that
     namespace;
  8. with internal_api_token_env set, events take the internal token and
     refuse the API token.
Every wait is bounded; logs stay in the work dir on failure.
"""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import federation_cluster as fc  # noqa: E402

PCP = sys.argv[1] if len(sys.argv) > 1 else os.environ["PCP_BINARY"]
HEARTBEAT_MS = 300
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, file=sys.stderr)
    return cond


def entity(eid, ns, visibility=None, name=None, mid=None):
    m = {"mutation_type": "upsert_entity", "namespace_id": ns,
         "target_id": eid,
         "payload": {"entity_type": "paper", "display_name": name or eid,
                     "properties": {"n": eid}}}
    if visibility:
        m["visibility"] = visibility
    if mid:
        m["mutation_id"] = mid
    return m


def mutate(gw, mutations):
    s, body = gw.call("POST", "/v1/graph/mutate", {"mutations": mutations})
    if not check(s == 200, "mutate on %s: %s %s" % (gw.gateway_id, s, body)):
        return []
    return body["mutation_ids"]


def ids(result, key="entities", field="entity_id"):
    return [item[field] for item in result.get(key, [])]


def hub_status(hub):
    s, body = hub.call("GET", "/v1/global-graph/status")
    return body if s == 200 else None


def lag_zero(gw):
    s, body = gw.call("GET", "/v1/graph/replication")
    return s == 200 and body["summary"]["replication_lag"] == 0 and body


def main():
    work = tempfile.mkdtemp(prefix="pcp-repl-")
    cluster = fc.Cluster(PCP, work, heartbeat_ms=HEARTBEAT_MS)
    try:
        run(cluster)
    finally:
        cluster.stop()
    if FAILURES:
        print("%d failure(s); logs in %s" % (len(FAILURES), work),
              file=sys.stderr)
        return 1
    print("replication_test: all checks passed")
    return 0


def run(cluster):
    hub = cluster.hub()
    a = cluster.gateway("gw-a")
    b = cluster.gateway("gw-b")
    open_ns, closed_ns = "lab-gw-a/shared", "lab-gw-a/private"

    # 1. Policies: defaults, validation, partial update.
    s, body = a.call("GET", "/v1/graph/policies")
    check(s == 200 and body["policies"] == [], "no policy at start: %s"
          % body)
    s, body = a.call("PUT", "/v1/graph/policies/" + open_ns,
                     {"default_visibility": "public"})
    check(s == 400 and "default_visibility" in str(body),
          "bad visibility is 400 naming the key: %s %s" % (s, body))
    s, body = a.call("PUT", "/v1/graph/policies/" + open_ns,
                     {"allow_global_replication": True, "bogus": 1})
    check(s == 400 and "bogus" in str(body), "unknown key is 400: %s" % body)
    s, body = a.call("PUT", "/v1/graph/policies/" + open_ns,
                     {"allow_global_replication": True,
                      "default_visibility": "global"})
    check(s == 200 and body["policy"]["allow_global_replication"] and
          not body["policy"]["allow_raw_payload_export"],
          "PUT policy: %s %s" % (s, body))
    s, body = a.call("PUT", "/v1/graph/policies/" + open_ns,
                     {"allow_raw_payload_export": True})
    check(s == 200 and body["policy"]["allow_global_replication"] and
          body["policy"]["allow_raw_payload_export"] and
          body["policy"]["default_visibility"] == "global",
          "partial PUT keeps the other fields: %s" % body)

    # Concurrent partial updates of one namespace lose none of them.
    import threading
    race_ns = "lab-gw-a/race"
    updates = [{"allow_global_replication": True},
               {"allow_raw_payload_export": True},
               {"default_visibility": "shared"}]
    for round_ in range(4):
        threads = [threading.Thread(target=a.call, args=(
            "PUT", "/v1/graph/policies/%s-%d" % (race_ns, round_), u))
            for u in updates]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    s, body = a.call("GET", "/v1/graph/policies")
    races = [p for p in body.get("policies", [])
             if p["namespace_id"].startswith(race_ns)]
    check(len(races) == 4 and all(
        p["allow_global_replication"] and p["allow_raw_payload_export"] and
        p["default_visibility"] == "shared" for p in races),
        "concurrent partial PUTs all applied: %s" % races)

    # 2. Mutations on A.
    mutate(a, [entity("a-g1", open_ns, "global"),
               entity("a-g2", open_ns, "global"),
               entity("a-s1", open_ns, "shared"),
               entity("a-default", open_ns),  # the policy's default: global
               entity("a-local", open_ns, "local"),
               entity("a-closed", closed_ns, "global"),
               entity("shared-id", open_ns, "global", name="from A"),
               {"mutation_type": "upsert_relation", "namespace_id": open_ns,
                "target_id": "a-rel", "visibility": "global",
                "payload": {"relation_type": "cites",
                            "from_entity_id": "a-g1",
                            "to_entity_id": "a-g2"}},
               {"mutation_type": "append_observation",
                "namespace_id": open_ns, "target_id": "a-obs",
                "visibility": "global",
                "payload": {"observation_type": "metric",
                            "subject_entity_id": "a-g1",
                            "payload": {"loss": 1.5}}}])
    expect_entities = {"a-g1", "a-g2", "a-s1", "a-default", "shared-id"}
    st = fc.wait_until(lambda: (lambda h: h and h["global_graph"]["entities"]
                                >= len(expect_entities) and h)(
                                    hub_status(hub)), 20, 0.1)
    check(st is not None, "A's eligible entities reached the hub: %s"
          % hub_status(hub))
    check(fc.wait_until(lambda: lag_zero(a), 20, 0.1),
          "A's replication lag drops to 0")
    st = hub_status(hub)
    if check(st is not None, "hub status"):
        g = st["global_graph"]
        check(g["entities"] == len(expect_entities) and g["relations"] == 1
              and g["observations"] == 1 and g["mutations"] == 7,
              "hub store counts (5 entities, 1 relation, 1 observation, "
              "7 mutations; local and closed never sent): %s" % g)
    s, body = hub.call("POST", "/v1/global-graph/query", {"limit": 100})
    check(s == 200 and set(ids(body)) == expect_entities and
          ids(body, "relations", "relation_id") == ["a-rel"] and
          ids(body, "observations", "observation_id") == ["a-obs"],
          "hub global query: %s %s" % (s, body))
    s, body = hub.call("GET", "/v1/graph/policies")
    hub_ns = [p["namespace_id"] for p in body.get("policies", [])]
    check(s == 200 and open_ns in hub_ns and closed_ns not in hub_ns,
          "hub policies from the snapshots (policy changes travel): %s"
          % body)
    s, body = hub.call("GET", "/v1/global-graph/replication")
    check(s == 200 and any(g["gateway_id"] == "gw-a" and
                           g["replication_lag"] == 0
                           for g in body["gateways"]),
          "hub replication lists gw-a with lag 0: %s" % body)
    s, body = a.call("POST", "/v1/graph/query", {"limit": 100})
    check(s == 200 and {"a-local", "a-closed"} <= set(ids(body)),
          "A's local query sees its own local items: %s" % ids(body))

    # 3. B's query modes.
    mutate(b, [entity("b-own", "lab-gw-b/shared", "local"),
               entity("shared-id", "lab-gw-b/shared", "local",
                      name="from B")])
    s, body = b.call("POST", "/v1/graph/query",
                     {"query_mode": "global", "limit": 100})
    check(s == 200 and set(ids(body)) == expect_entities,
          "B's global query = A's replicated items only: %s %s" % (s, body))
    s, body = b.call("POST", "/v1/graph/query",
                     {"query_mode": "local_plus_global", "limit": 100})
    got = ids(body) if s == 200 else []
    check(len(got) == len(set(got)), "local_plus_global de-duplicates: %s"
          % got)
    check(set(got) == expect_entities | {"b-own"},
          "local_plus_global = B's items + A's global ones: %s" % got)
    check(got[:2] == ["shared-id", "b-own"] or got[:2] == ["b-own",
                                                           "shared-id"],
          "local items first: %s" % got)
    for e in body.get("entities", []):
        if e["entity_id"] == "shared-id":
            check(e["display_name"] == "from B",
                  "the local version of a shared id wins: %s" % e)
    s, body = b.call("POST", "/v1/graph/query", {"query_mode": "everywhere"})
    check(s == 400 and "query_mode" in str(body), "unknown mode 400: %s"
          % body)

    # 4. Event ingest on A (no internal token configured: the API token).
    events = {"events": [
        {"event_id": "ev-1", "service_id": "svc-1",
         "event_type": "training.step", "job_id": "job-9",
         "namespace_id": open_ns, "payload": {"loss": 2.5}},
        {"event_id": "ev-2", "service_id": "svc-1",
         "event_type": "service.ready", "namespace_id": open_ns}]}
    s, body = a.call("POST", "/v1/internal/events", events)
    mids = [m for e in body.get("events", []) for m in e["mutation_ids"]] \
        if s == 200 else []
    check(mids == ["ev-1:subject", "ev-1:observation", "ev-2:subject",
                   "ev-2:observation"], "events -> 4 mutations: %s %s"
          % (s, body))
    s, body = a.call("POST", "/v1/internal/events", events)
    check(s == 200, "a resent event batch is accepted: %s" % body)
    s, body = a.call("POST", "/v1/internal/events",
                     {"events": [{"event_id": "ev-3"}]})
    check(s == 400 and "events[0]" in str(body),
          "a bad event is 400 naming it: %s %s" % (s, body))
    s, body = a.call("POST", "/v1/internal/events", events, token=None)
    check(s == 401, "events need a token: %s" % s)
    s, body = a.call("POST", "/v1/graph/query",
                     {"entity_id": "job:job-9", "limit": 10})
    check(s == 200 and ids(body) == ["job:job-9"] and
          body["entities"][0]["entity_type"] == "training_job" and
          ids(body, "observations", "observation_id") == ["ev-1"],
          "the event's subject and observation on A: %s" % body)
    expect_entities |= {"job:job-9", "service:svc-1"}
    check(fc.wait_until(lambda: hub_status(hub)["global_graph"]["entities"]
                        == len(expect_entities), 20, 0.1),
          "events replicated: %s" % hub_status(hub))

    # 5. Hub SIGKILL while A pushes; nothing lost, nothing twice.
    check(fc.wait_until(lambda: lag_zero(a), 20, 0.1), "lag 0 before kill")
    before = hub_status(hub)["global_graph"]
    bulk = [entity("bulk-%03d" % i, open_ns, "global") for i in range(300)]
    mutate(a, bulk[:150])
    time.sleep(HEARTBEAT_MS / 1000.0)  # a push may be in flight
    hub.kill()
    mutate(a, bulk[150:])
    s, body = b.call("POST", "/v1/graph/query", {"query_mode": "global"})
    check(s == 502 and isinstance(body, dict) and "error" in str(body),
          "global query with the hub down is 502 JSON: %s %s" % (s, body))
    s, body = b.call("POST", "/v1/graph/query",
                     {"query_mode": "local_plus_global"})
    check(s == 502, "local_plus_global with the hub down is 502: %s" % s)
    hub.start()
    after = fc.wait_until(lambda: lag_zero(a) and (lambda h: h and h[
        "global_graph"]["entities"] == len(expect_entities) + 300 and h)(
            hub_status(hub)), 40, 0.2)
    if check(after, "replication resumed after the hub restart: %s / %s"
             % (hub_status(hub), lag_zero(a))):
        g = after["global_graph"]
        check(g["entities"] == before["entities"] + 300,
              "entities before %d + 300 == after %d" % (before["entities"],
                                                         g["entities"]))
        check(g["mutations"] == before["mutations"] + 300,
              "no mutation applied twice: before %d + 300 == after %d"
              % (before["mutations"], g["mutations"]))
    s, text = fc.call(hub.base, "GET", "/metrics")
    applied = [l for l in str(text).splitlines() if l.startswith(
        'pcp_hub_replicated_mutations_total{result="applied"}')]
    check(s == 200 and applied and float(applied[0].split()[-1]) >= 150,
          "hub metrics count applied mutations (>= the 150 written while "
          "it was down): %s" % applied)
    s, body = a.call("GET", "/v1/graph/replication")
    ns = {n["namespace_id"]: n for n in body.get("namespaces", [])}
    check(s == 200 and ns.get(open_ns, {}).get("replication_lag") == 0 and
          ns.get(closed_ns, {}).get("global_mutations") == 1,
          "A's per-namespace status: %s" % body)

    s, body = a.call("GET", "/v1/federation/replication")
    ns = {n["namespace_id"]: n for n in body.get("namespaces", [])}
    check(s == 200 and body["summary"]["namespace_count"] == 6 and
          ns.get(open_ns, {}).get("allow_global_replication") is True,
          "/v1/federation/replication lists the namespaces: %s" % body)

    # 6. The hub's route refuses what it must, before applying anything.
    item = {"sequence_no": 1, "mutation_id": "x1",
            "namespace_id": "lab-gw-a/closed2",
            "mutation_type": "upsert_entity", "target_id": "x1",
            "payload_json": "{\"entity_type\": \"t\"}",
            "visibility": "global", "provenance_json": "{}",
            "timestamp_ns": 1}
    batch = {"gateway_id": "gw-a", "through_sequence_no": 1,
             "last_sequence_no": 1, "mutations": [item]}
    before = hub_status(hub)["global_graph"]
    s, body = hub.call("POST", "/v1/federation/mutations", batch,
                       token=fc.FED_TOKEN)
    check(s == 409 and "PolicyRejected" in str(body),
          "an item without an allowing policy is 409 PolicyRejected: %s %s"
          % (s, body))
    s, body = hub.call("POST", "/v1/federation/mutations",
                       dict(batch, gateway_id="gw-nobody"),
                       token=fc.FED_TOKEN)
    check(s == 400 and "UnknownGateway" in str(body),
          "an unregistered gateway is 400 UnknownGateway: %s %s" % (s, body))
    s, body = hub.call("POST", "/v1/federation/mutations",
                       dict(batch, mutations=[dict(item, visibility="public")],
                            namespace_policies=[]), token=fc.FED_TOKEN)
    check(s == 400 and "visibility" in str(body),
          "a bad visibility is 400 naming it: %s %s" % (s, body))
    s, body = hub.call("POST", "/v1/federation/mutations",
                       {"gateway_id": "gw-a", "mutations": []},
                       token=fc.FED_TOKEN)
    check(s == 400 and "through_sequence_no" in str(body),
          "a batch without through_sequence_no is 400: %s %s" % (s, body))
    s, body = hub.call("POST", "/v1/federation/mutations", batch)
    check(s == 403, "the client token cannot push mutations: %s" % s)
    s, body = hub.call("POST", "/v1/federation/global-graph/query", {})
    check(s == 403, "the client token cannot use the gateways' query: %s" % s)
    check(hub_status(hub)["global_graph"] == before,
          "refused batches changed nothing on the hub")

    # Deletes replicate; one of an entity the hub never held (a-local was
    # local) is a no-op there, not a batch refused forever.
    n_before = hub_status(hub)["global_graph"]["entities"]
    mutate(a, [{"mutation_type": "delete_entity", "namespace_id": open_ns,
                "target_id": "bulk-000", "visibility": "global"},
               {"mutation_type": "delete_entity", "namespace_id": open_ns,
                "target_id": "a-local", "visibility": "global"}])
    check(fc.wait_until(lambda: hub_status(hub)["global_graph"]["entities"]
                        == n_before - 1, 20, 0.1),
          "a replicated delete removes the entity on the hub: %s"
          % hub_status(hub))
    st = fc.wait_until(lambda: lag_zero(a), 20, 0.1)
    check(st and st["last_error"] is None,
          "the delete of an entity the hub never held does not stop "
          "replication: %s" % st)

    # 7. A revoked policy reaches the hub, which stops answering it. An
    # older visible item in another namespace must still fill a page of 1:
    # the newer hidden ones may not crowd it out (the hub filters after the
    # store query, so it over-fetches and cuts to the limit).
    kept_ns = "lab-gw-a/kept"
    s, body = a.call("PUT", "/v1/graph/policies/" + kept_ns,
                     {"allow_global_replication": True,
                      "default_visibility": "global"})
    check(s == 200, "PUT policy %s: %s" % (kept_ns, body))
    mutate(a, [entity("kept-old", kept_ns, "global")])
    time.sleep(0.01)
    mutate(a, [entity("hidden-new", open_ns, "global")])
    check(fc.wait_until(lambda: lag_zero(a), 20, 0.1),
          "kept-old and hidden-new replicated")
    s, body = a.call("PUT", "/v1/graph/policies/" + open_ns,
                     {"allow_global_replication": False})
    check(s == 200, "revoke: %s" % body)
    check(fc.wait_until(lambda: ids(hub.call(
        "POST", "/v1/global-graph/query", {"limit": 10})[1]) ==
        ["kept-old"], 20, 0.1), "the hub hides a revoked namespace")
    s, body = hub.call("POST", "/v1/global-graph/query", {"limit": 1})
    check(s == 200 and ids(body) == ["kept-old"],
          "a page of 1 holds the visible item, not a hidden newer one: %s"
          % body)

    # 8. With an internal token, events take it (and not the API token).
    os.environ["FED_GW_INTERNAL"] = "internal-secret"  # inherited
    c = cluster.gateway("gw-c", extra_config={
        "internal_api_token_env": "FED_GW_INTERNAL"})
    one = {"events": [{"event_id": "c-1", "service_id": "s",
                       "event_type": "rl.step"}]}
    s, body = c.call("POST", "/v1/internal/events", one)
    check(s == 403, "the API token is refused when an internal token is "
          "configured: %s %s" % (s, body))
    s, body = c.call("POST", "/v1/internal/events", one,
                     token="internal-secret")
    check(s == 200 and body["events"][0]["mutation_ids"] ==
          ["c-1:subject", "c-1:observation"],
          "the internal token ingests: %s %s" % (s, body))


if __name__ == "__main__":
    sys.exit(main())
