#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Process helpers for the federation tests (issue 15): a `pcp
--federation-hub`, gateways with `federation.*` set, node managers with CPU
workers, all real processes on 127.0.0.1. Shared by federation_test.py,
federation_client_test.py and the replication / graph tests.

    c = Cluster(pcp, work)
    hub = c.hub()                       # started, /healthz answered
    gw = c.gateway("gw-a", workers=1)   # gateway + node manager, joined
    status, body = gw.call("GET", "/v1/federation/status")
    hub.kill(); hub.start()             # SIGKILL and restart, same state
    c.stop()                            # SIGTERM all, SIGKILL stragglers

Every wait is bounded; a process that does not come up raises with the tail
of its stderr file (kept in |work|).
"""
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

API_TOKEN = "fed-api-token"          # each gateway's API token
HUB_TOKEN = "fed-hub-client-token"   # the hub's client token
FED_TOKEN = "fed-federation-token"   # hub <-> gateway credential
JOIN = "fed-join-token"              # worker join token
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base, method, path, body=None, token=None, timeout=30,
         headers=None):
    """(status, parsed JSON or text). Connection errors raise OSError."""
    data = None
    h = dict(headers or {})
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        h["Content-Type"] = "application/json"
    if token:
        h["Authorization"] = "Bearer " + token
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers=h)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            payload, status = r.read(), r.status
    except urllib.error.HTTPError as e:
        payload, status = e.read(), e.code
    try:
        return status, json.loads(payload.decode() or "null")
    except ValueError:
        return status, payload.decode(errors="replace")


def wait_until(pred, seconds, step=0.05):
    """pred()'s first truthy value within |seconds|, else None. Exceptions
    from pred (a process still starting) count as falsy."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            v = pred()
            if v:
                return v
        except (OSError, ValueError, KeyError, TypeError):
            pass
        time.sleep(step)
    return None


def tail(path, n=2000):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return "(no log)"


class Process:
    """One child with a stderr file per start."""

    def __init__(self, work, name):
        self.work, self.name = work, name
        self.proc = None
        self.starts = 0
        self.err_path = None

    def spawn(self, argv, env):
        self.starts += 1
        self.err_path = os.path.join(self.work, "%s.%d.err" % (self.name,
                                                              self.starts))
        self.proc = subprocess.Popen(argv, env=env,
                                     stderr=open(self.err_path, "w"),
                                     stdout=subprocess.DEVNULL)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        """SIGKILL and reap."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, seconds=20):
        """SIGTERM; SIGKILL past |seconds|. The exit code (None if killed)."""
        if not self.alive():
            return self.proc.returncode if self.proc else None
        self.proc.terminate()
        try:
            return self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return None


class Hub(Process):
    """`pcp --federation-hub` on its own state dir."""

    def __init__(self, cluster, heartbeat_ms):
        super().__init__(cluster.work, "hub")
        self.pcp = cluster.pcp
        self.port = free_port()
        self.base = "http://127.0.0.1:%d" % self.port
        self.state_dir = os.path.join(cluster.work, "hub-state")
        self.heartbeat_ms = heartbeat_ms

    def start(self, extra=()):
        env = dict(os.environ, FED_HUB_API_TOKEN=HUB_TOKEN,
                   FED_HUB_FED_TOKEN=FED_TOKEN)
        self.spawn([self.pcp, "--federation-hub", "--api-host", "127.0.0.1",
                    "--api-port", str(self.port), "--state-dir",
                    self.state_dir, "--api-token-env", "FED_HUB_API_TOKEN",
                    "--federation-token-env", "FED_HUB_FED_TOKEN",
                    "--heartbeat-interval-ms", str(self.heartbeat_ms)]
                   + list(extra), env)
        if not wait_until(lambda: self.alive() and
                          call(self.base, "GET", "/healthz")[0] == 200, 20):
            raise RuntimeError("hub did not start: " + tail(self.err_path))

    def call(self, method, path, body=None, token=HUB_TOKEN, timeout=30):
        return call(self.base, method, path, body, token, timeout)


class Gateway(Process):
    """`pcp --gateway` with federation towards |upstream| and, optionally,
    a node manager with CPU workers on its fabric."""

    def __init__(self, cluster, gateway_id, upstream, heartbeat_ms,
                 federation_token=True, enabled=True, extra_config=None,
                 token_value=FED_TOKEN):
        super().__init__(cluster.work, gateway_id)
        self.token_value = token_value
        self.pcp = cluster.pcp
        self.gateway_id = gateway_id
        self.port, self.fabric_port = free_port(), free_port()
        self.base = "http://127.0.0.1:%d" % self.port
        self.dir = os.path.join(cluster.work, gateway_id)
        os.makedirs(self.dir, exist_ok=True)
        self.config = os.path.join(self.dir, "gateway.json")
        roots = [os.path.join(ROOT, "data"), os.path.join(ROOT, "tests"),
                 cluster.work]
        federation = {"enabled": enabled, "upstream": upstream,
                      "heartbeat_interval_ms": heartbeat_ms}
        if federation_token:
            federation["token_env"] = "FED_GW_FED_TOKEN"
        config = {"gateway_id": gateway_id, "lab_id": "lab-" + gateway_id,
                  "state_dir": os.path.join(self.dir, "state"),
                  "api": {"token_env": "FED_GW_API_TOKEN"},
                  "federation": federation,
                  "data_roots": roots, "model_roots": roots,
                  "worker_fabric": {"host": "127.0.0.1",
                                    "port": self.fabric_port,
                                    "join_token_env": "FED_GW_JOIN",
                                    "heartbeat_ms": 1000}}
        config.update(extra_config or {})
        with open(self.config, "w") as f:
            json.dump(config, f)
        self.nm = None

    def start(self):
        env = dict(os.environ, FED_GW_API_TOKEN=API_TOKEN,
                   FED_GW_FED_TOKEN=self.token_value, FED_GW_JOIN=JOIN)
        self.spawn([self.pcp, "--gateway", "--gateway-config", self.config,
                    "--api-host", "127.0.0.1", "--api-port", str(self.port)],
                   env)
        if not wait_until(lambda: self.alive() and
                          call(self.base, "GET", "/healthz")[0] == 200, 20):
            raise RuntimeError("gateway %s did not start: %s" %
                               (self.gateway_id, tail(self.err_path)))

    def start_workers(self, count=1, target=None):
        """A node manager with |count| CPU workers (joining with |target|
        when given); waits for them."""
        self.nm = Process(self.work, self.gateway_id + "-nm")
        env = dict(os.environ, PCP_WORKER_JOIN_TOKEN=JOIN)
        extra = ["--target", target] if target else []
        self.nm.spawn([self.pcp, "--node-manager", "--scale", str(count),
                       "--host", "127.0.0.1", "--port", str(self.fabric_port),
                       "--backend", "cpu", "--api-port", "0"] + extra, env)
        if not wait_until(lambda: self.call("GET", "/v1/workers")[1][
                "counts"]["connected"] >= count, 60, 0.2):
            raise RuntimeError("workers of %s did not join: %s" %
                               (self.gateway_id, tail(self.nm.err_path)))

    def call(self, method, path, body=None, token=API_TOKEN, timeout=30):
        return call(self.base, method, path, body, token, timeout)

    def kill(self):
        """SIGKILL the gateway and its node manager."""
        super().kill()
        if self.nm:
            self.nm.kill()

    def terminate(self, seconds=20):
        code = super().terminate(seconds)
        if self.nm:
            self.nm.terminate(seconds)
        return code


class Cluster:
    def __init__(self, pcp, work, heartbeat_ms=500):
        self.pcp, self.work, self.heartbeat_ms = pcp, work, heartbeat_ms
        self.hubs, self.gateways = [], []

    def hub(self, extra=()):
        h = Hub(self, self.heartbeat_ms)
        h.start(extra)
        self.hubs.append(h)
        return h

    def gateway(self, gateway_id, workers=0, upstream=None, target=None,
                **kwargs):
        if upstream is None:
            upstream = self.hubs[0].base
        g = Gateway(self, gateway_id, upstream, self.heartbeat_ms, **kwargs)
        g.start()
        self.gateways.append(g)
        if workers:
            g.start_workers(workers, target)
        return g

    def stop(self):
        for p in self.gateways + self.hubs:
            try:
                p.terminate(15)
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass
