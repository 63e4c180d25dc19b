#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Limits of the hub's gateway-facing routes, found in review (issue 15):
one `pcp --federation-hub` and one `pcp --gateway` (no workers), real
processes on 127.0.0.1.

  1. POST /v1/federation/mutations with a namespace policy snapshot whose
     updated_at_ms is out of range (negative, or so large that it overflows
     as nanoseconds): 400 naming updated_at_ms, and the hub keeps no policy
     for that namespace; an in-range one is accepted.
Every wait is bounded; logs stay in the work dir on failure.
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import federation_cluster as fc  # noqa: E402

PCP = sys.argv[1] if len(sys.argv) > 1 else os.environ["PCP_BINARY"]
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, file=sys.stderr)
    return cond


def hub_policies(hub):
    s, body = hub.call("GET", "/v1/graph/policies")
    return body if s == 200 else None


def run(cluster):
    hub = cluster.hub()
    cluster.gateway("gw-l")
    check(fc.wait_until(lambda: "gw-l" in str(hub.call(
        "GET", "/v1/federation/peers")[1]), 20, 0.1),
        "the gateway registered with the hub")

    def batch(ns, at):
        return {"gateway_id": "gw-l", "through_sequence_no": 1,
                "last_sequence_no": 1, "mutations": [],
                "namespace_policies": [{
                    "namespace_id": ns, "updated_at_ms": at,
                    "default_visibility": "global",
                    "allow_global_replication": True,
                    "allow_raw_payload_export": False}]}

    for at in (2 ** 62, 2 ** 63 - 1, -5):
        ns = "lab-gw-l/bad%d" % (at & 0xffff)
        s, body = hub.call("POST", "/v1/federation/mutations",
                           batch(ns, at), token=fc.FED_TOKEN)
        check(s == 400 and "updated_at_ms" in str(body),
              "updated_at_ms %d is 400 naming it: %s %s" % (at, s, body))
        check(ns not in str(hub_policies(hub)),
              "the refused snapshot left no policy on the hub: %s"
              % hub_policies(hub))
    s, body = hub.call("POST", "/v1/federation/mutations",
                       batch("lab-gw-l/ok", 1700000000000),
                       token=fc.FED_TOKEN)
    check(s == 200 and "lab-gw-l/ok" in str(hub_policies(hub)),
          "an in-range snapshot is accepted: %s %s" % (s, body))


def main():
    work = tempfile.mkdtemp(prefix="pcp-fedlim-")
    cluster = fc.Cluster(PCP, work, heartbeat_ms=300)
    try:
        run(cluster)
    finally:
        cluster.stop()
    if FAILURES:
        print("%d failure(s); logs in %s" % (len(FAILURES), work),
              file=sys.stderr)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    print("federation_limits_test: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
