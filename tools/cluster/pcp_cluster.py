#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A PCP deployment inside a tools/cluster cluster, for tests and benches
(docs/cluster.md "PCP in a cluster"): `pcp --gateway` in host h0 and one
`pcp --node-manager` per worker host h1..hN, every server on its host's
private address, the worker hosts behind shaped links.

    with PcpCluster(pcp, worker_hosts=2, rate="100mbit", work=tmp) as pc:
        status, job = pc.request("POST", "/v1/training/jobs", experiment)
        pc.workers()          # GET /v1/workers

Python 3.11 standard library only.
"""
import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request

import cluster

API_PORT, FABRIC_PORT = 8000, 8080


class PcpClusterError(Exception):
    """The deployment did not come up (the message names the step and the
    log file to read)."""


class PcpCluster:
    """|worker_hosts| hosts (1..63) with a node manager of |scale| CPU
    workers each (`--backend cpu` unless |node_manager_args| says
    otherwise), behind |rate| (None: unshaped); the gateway's host h0 is
    behind |gateway_rate|. Logs and the gateway's state go under |work|.
    |config_extra| is merged into the gateway config (data_roots and
    model_roots default to the repository's data/ and |work|).
    |per_host_cache| (default) gives each worker host its own
    PCP_CACHE_DIR under |work|, as separate machines have separate disks:
    every worker then fetches its programs over its own link instead of
    finding the first worker's copy (the gateway keeps the caller's
    PCP_CACHE_DIR, so its compiled artifacts stay cached across runs).
    |heartbeat_ms| is the gateway's heartbeat (1000, the fabric's default:
    bytes of a frame still crossing a slow link count as life, so a big
    task input no longer needs a longer one; docs/cluster.md "Slow links
    and the fabric's heartbeat")."""

    def __init__(self, pcp, work, worker_hosts=2, rate="100mbit",
                 gateway_rate=None, scale=1, heartbeat_ms=1000,
                 config_extra=None, node_manager_args=(), join_timeout_s=90,
                 token="cluster-api-token", join_token="cluster-join-token",
                 per_host_cache=True, log=print, **cluster_kw):
        if not 1 <= worker_hosts < cluster.MAX_HOSTS:
            raise ValueError("worker_hosts %r: want 1..%d" % (
                worker_hosts, cluster.MAX_HOSTS - 1))
        if not 1 <= scale <= 64:
            raise ValueError("scale %r: want 1..64" % scale)
        self.pcp, self.work = os.path.abspath(pcp), work
        self.worker_hosts, self.scale = worker_hosts, scale
        self.heartbeat_ms, self.join_timeout_s = heartbeat_ms, join_timeout_s
        self.config_extra = dict(config_extra or {})
        self.node_manager_args = list(node_manager_args)
        self.token, self.join_token, self.log = token, join_token, log
        self.per_host_cache = per_host_cache
        self.cluster = cluster.Cluster(
            hosts=worker_hosts + 1,
            rates=[gateway_rate] + [rate] * worker_hosts, log=log,
            **cluster_kw)
        self.gateway = None
        self.node_managers = {}
        self.base = None

    # ------------------------------------------------------------ set-up
    def __enter__(self):
        self.cluster.__enter__()
        try:
            self._start()
        except BaseException:
            self.cluster.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        return self.cluster.__exit__(*exc)

    def env(self):
        return dict(os.environ, PCP_CLUSTER_API_TOKEN=self.token,
                    PCP_CLUSTER_JOIN_TOKEN=self.join_token,
                    PCP_WORKER_JOIN_TOKEN=self.join_token)

    def _start(self):
        c = self.cluster
        gw = c.addr(0)
        self.base = "http://%s:%d" % (gw, API_PORT)
        root = os.path.abspath(os.path.join(os.path.dirname(__file__),
                                            "..", ".."))
        roots = [os.path.join(root, "data"), self.work]
        config = {"gateway_id": "gw-cluster", "lab_id": "lab",
                  "state_dir": os.path.join(self.work, "state"),
                  "api": {"token_env": "PCP_CLUSTER_API_TOKEN"},
                  "worker_fabric": {"host": gw, "port": FABRIC_PORT,
                                    "join_token_env":
                                        "PCP_CLUSTER_JOIN_TOKEN",
                                    "heartbeat_ms": self.heartbeat_ms},
                  "data_roots": roots, "model_roots": roots}
        config.update(self.config_extra)
        self.config_path = os.path.join(self.work, "gateway.json")
        with open(self.config_path, "w") as f:
            json.dump(config, f)
        self.start_gateway()
        for i in range(1, self.worker_hosts + 1):
            self.start_node_manager(i)
        want = self.worker_hosts * self.scale
        if not self.wait_for(lambda: self.connected() == want,
                             self.join_timeout_s):
            raise PcpClusterError(
                "%d of %d workers joined in %d s (logs: %s/nm*.err)" % (
                    self.connected() or 0, want, self.join_timeout_s,
                    self.work))

    def start_gateway(self):
        """(Re)starts the gateway in h0 and waits for /healthz (60 s)."""
        c = self.cluster
        self.gateway = c.spawn(
            0, [self.pcp, "--gateway", "--gateway-config", self.config_path,
                "--api-host", c.addr(0), "--api-port", str(API_PORT)],
            env=self.env(),
            stderr=open(os.path.join(self.work, "gw.err"), "a"))
        if not self.wait_for(lambda: self.request("GET", "/healthz")[0] ==
                             200, 60):
            raise PcpClusterError("the gateway did not answer /healthz on "
                                  "%s in 60 s (log: %s/gw.err)" % (
                                      self.base, self.work))

    def start_node_manager(self, i):
        """Starts host i's node manager (its workers connect to h0)."""
        c = self.cluster
        env = self.env()
        if self.per_host_cache:
            env["PCP_CACHE_DIR"] = os.path.join(self.work, "cache-h%d" % i)
        self.node_managers[i] = c.spawn(
            i, [self.pcp, "--node-manager", "--scale", str(self.scale),
                "--host", c.addr(0), "--port", str(FABRIC_PORT),
                "--api-host", c.addr(i), "--api-port", "0"] +
            (["--backend", "cpu"] if "--backend" not in
             self.node_manager_args else []) + self.node_manager_args,
            env=env,
            stderr=open(os.path.join(self.work, "nm%d.err" % i), "a"))
        return self.node_managers[i]

    # --------------------------------------------------------------- API
    def request(self, method, path, body=None, timeout=30):
        """(status, parsed JSON) of the gateway's API, from inside h0;
        (None, message) when it cannot be reached."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.base + path, data=data, method=method,
            headers={"Authorization": "Bearer " + self.token,
                     "Content-Type": "application/json"})
        with self.cluster.inside(0):
            try:
                with urllib.request.urlopen(req, timeout=timeout) as r:
                    return r.status, json.loads(r.read() or b"null")
            except urllib.error.HTTPError as e:
                try:
                    return e.code, json.loads(e.read() or b"null")
                except ValueError:
                    return e.code, None
            except (OSError, ValueError) as e:
                return None, str(e)

    def workers(self):
        s, r = self.request("GET", "/v1/workers")
        return r.get("workers", []) if s == 200 else []

    def connected(self):
        s, r = self.request("GET", "/v1/workers")
        return r.get("counts", {}).get("connected") if s == 200 else None

    def link_bytes(self, i):
        """(uplink, downlink) bytes host i's tbf qdiscs sent (0 for an
        unshaped host): what its link carried."""
        c = self.cluster
        return (tc_sent(["-n", c.ns(i), "qdisc", "show", "dev", "eth0"]),
                tc_sent(["-n", c.hub, "qdisc", "show", "dev", "p%d" % i]))

    @staticmethod
    def wait_for(pred, seconds, period=0.2):
        deadline = time.time() + seconds
        while time.time() < deadline:
            v = pred()
            if v:
                return v
            time.sleep(period)
        return None


def tc_sent(args):
    """Bytes the tbf qdisc of `tc -s <args>` sent, 0 when there is none."""
    r = subprocess.run(["tc", "-s"] + args, capture_output=True, text=True,
                       timeout=30)
    m = re.search(r"qdisc tbf .*?Sent (\d+) bytes", r.stdout, re.S)
    return int(m.group(1)) if m else 0


def run_test(name, pcp, data, run, check, failures, **cluster_kwargs):
    """The frame of a test on a PcpCluster (tests/cluster): needs root and
    network namespaces (cluster.require_or_exit fails clearly without
    them), clears stale clusters, builds one with |cluster_kwargs| under a
    fresh work dir, calls run(pc), checks that no namespace is left, prints
    the time and the failures (with the .err logs' tails). Returns the
    process exit code: 0, or 1 when |failures| is not empty."""
    import shutil
    import sys
    import tempfile
    cluster.require_or_exit(name)
    cluster.cleanup_stale(log=print)
    if not os.path.exists(data):
        check(False, "no %s" % data)
        return 1
    work = tempfile.mkdtemp(prefix="pcp-%s-" % name)
    t0 = time.time()
    tag = None
    try:
        with PcpCluster(pcp, work, **cluster_kwargs) as pc:
            tag = pc.cluster.tag
            run(pc)
    except PcpClusterError as e:
        check(False, str(e))
    if tag:
        left = subprocess.run(["ip", "netns", "list"], capture_output=True,
                              text=True).stdout
        check("pcp-%s-" % tag not in left, "no namespace of %s left" % tag)
    print("%s: %.1f s, %d failures" % (name, time.time() - t0, len(failures)))
    if failures:
        print("logs in %s" % work, file=sys.stderr)
        for entry in sorted(os.listdir(work)):
            if entry.endswith(".err"):
                with open(os.path.join(work, entry)) as f:
                    print("--- %s (tail)\n%s" % (entry, f.read()[-1500:]),
                          file=sys.stderr)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    return 0
