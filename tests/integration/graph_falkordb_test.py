#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The gateway with graph_backend "falkordb" (issue 15 item 4) against a real
FalkorDB server started here on 127.0.0.1:

  1. mutate + query over HTTP; the entities are in FalkorDB (read back with
     GRAPH.QUERY, not through the gateway) and the log is in SQLite
     (/v1/graph/status counts both);
  2. hostile text (quotes, backslashes, Cypher) round-trips as parameters;
  3. a gateway restart keeps the graph and the log in step (no replay
     duplicates, same counts);
  4. FalkorDB down: the gateway does not start (clear error); down while
     running: 503 JSON, nothing logged, recovered once it is back;
  5. graph_backend "neo4j" is refused at config load, listing the supported
     backends.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import falkordb_server  # noqa: E402

PCP = sys.argv[1] if len(sys.argv) > 1 else os.environ["PCP_BINARY"]
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, file=sys.stderr)


def call(base, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, raw.decode(errors="replace")


def wait_ready(base, proc, timeout_s=60):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=2):
                return True
        except Exception:
            time.sleep(0.2)
    return False


class Gateway:
    def __init__(self, work, name, config):
        self.port = falkordb_server.free_port()
        # Two unbound probes can return the same port: the gateway refuses
        # an API and a fabric port that are equal, so draw until they differ.
        control = falkordb_server.free_port()
        while control == self.port:
            control = falkordb_server.free_port()
        self.base = "http://127.0.0.1:%d" % self.port
        path = os.path.join(work, name + ".json")
        with open(path, "w") as f:
            json.dump(config, f)
        self.err = os.path.join(work, name + ".err")
        self.proc = subprocess.Popen(
            [PCP, "--gateway", "--gateway-config", path, "--api-port",
             str(self.port), "--control-port", str(control)],
            stderr=open(self.err, "w"),
            env=dict(os.environ, PCP_WORKER_JOIN_TOKEN="graph-join"))

    def stop(self):
        """SIGTERM; checks a clean exit (0, no sanitizer report)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            check(self.proc.returncode == 0 and
                  "Sanitizer" not in self.log(),
                  "%s exits cleanly on SIGTERM: rc=%r %s" %
                  (self.err, self.proc.returncode, self.log()[-1500:]))

    def log(self):
        with open(self.err) as f:
            return f.read()


def mutation(target, etype, name, ns="lab", **extra):
    m = {"mutation_type": "upsert_entity", "namespace_id": ns,
         "target_id": target,
         "payload": {"entity_type": etype, "display_name": name,
                     "properties": extra}}
    return m


def main():
    work = tempfile.mkdtemp(prefix="pcp-graph-falkordb-")
    server = falkordb_server.Server(work)
    config = {"gateway_id": "gw-f", "lab_id": "lab",
              "state_dir": os.path.join(work, "state"),
              "graph_backend": "falkordb",
              "falkordb": {"host": "127.0.0.1", "port": server.port,
                           "graph": "gw_f"}}
    gateways = []
    try:
        g = Gateway(work, "gw", config)
        gateways.append(g)
        check(wait_ready(g.base, g.proc), "gateway with falkordb started: " +
              (g.log()[-2000:] if g.proc.poll() is not None else ""))
        if FAILURES:
            return 1
        code, ctrl = call(g.base, "GET", "/v1/controller")
        check(code == 200 and ctrl.get("graph_backend") == "falkordb",
              "controller names the backend: %r" % (ctrl,))
        # 1. mutate + query.
        hostile = 'x"}) DETACH DELETE n // \\ \' $id'
        body = {"mutations": [
            mutation("alice", "person", "Alice", age=30),
            mutation("bob", "person", hostile, note=hostile + "\n\t"),
            {"mutation_type": "upsert_relation", "target_id": "r1",
             "payload": {"relation_type": "knows", "from_entity_id": "alice",
                         "to_entity_id": "bob"}},
            {"mutation_type": "append_observation", "target_id": "o1",
             "mutation_id": "obs-1",
             "payload": {"observation_type": "login",
                         "subject_entity_id": "alice",
                         "payload": {"ok": True}}},
        ]}
        code, out = call(g.base, "POST", "/v1/graph/mutate", body)
        check(code == 200 and out.get("mutation_ids") ==
              ["mut_1", "mut_2", "mut_3", "obs-1"],
              "mutate accepted: %d %r" % (code, out))
        code, out = call(g.base, "POST", "/v1/graph/query",
                         {"entity_id": "alice"})
        check(code == 200 and [e["entity_id"] for e in out["entities"]] ==
              ["alice"] and len(out["relations"]) == 1 and
              out["relations"][0]["to_entity_id"] == "bob" and
              out["observations"][0]["payload"] == {"ok": True},
              "query by entity: %d %r" % (code, out))
        # 2. hostile text round-trips and matches literally.
        code, out = call(g.base, "POST", "/v1/graph/query", {"text": hostile})
        bob = [e for e in out.get("entities", []) if e["entity_id"] == "bob"]
        check(code == 200 and len(bob) == 1 and
              bob[0]["display_name"] == hostile and
              bob[0]["properties"]["note"] == hostile + "\n\t",
              "hostile text round-trips: %d %r" % (code, out))
        # The data is in FalkorDB itself.
        rows = server.command(
            "GRAPH.RO_QUERY", "gw_f",
            "MATCH (e:KGEntity) WHERE e.stub = false "
            "RETURN e.entity_id ORDER BY e.entity_id")
        check(rows[1] == [["alice"], ["bob"]],
              "entities stored in FalkorDB: %r" % (rows,))
        code, st = call(g.base, "GET", "/v1/graph/status")
        check(code == 200 and st["backend"] == "falkordb" and
              st["entities"] == 2 and st["relations"] == 1 and
              st["observations"] == 1 and st["last_sequence"] == 4,
              "status: %r" % (st,))
        # Bad input: 400 JSON naming the problem, nothing logged.
        code, out = call(g.base, "POST", "/v1/graph/mutate", {"mutations": [
            {"mutation_type": "upsert_entity", "target_id": "x",
             "payload": {}}]})
        check(code == 400 and "entity_type" in json.dumps(out),
              "missing entity_type -> 400: %d %r" % (code, out))
        code, out = call(g.base, "POST", "/v1/graph/mutate", {"mutations": [
            {"mutation_type": "delete_entity", "target_id": "ghost"}]})
        check(code == 404, "delete unknown -> 404: %d %r" % (code, out))
        # A duplicate mutation_id applies nothing.
        code, out = call(g.base, "POST", "/v1/graph/mutate", {"mutations": [
            dict(mutation("alice", "robot", "Changed"), mutation_id="mut_1")]})
        code, e = call(g.base, "GET", "/v1/graph/entities/alice")
        check(e["entities"][0]["entity_type"] == "person",
              "duplicate id applied nothing: %r" % (e,))
        code, st = call(g.base, "GET", "/v1/graph/status")
        check(st["last_sequence"] == 4, "nothing logged: %r" % (st,))

        # 3. restart: same graph, same log, no replayed duplicates.
        g.stop()
        g = Gateway(work, "gw2", config)
        gateways.append(g)
        check(wait_ready(g.base, g.proc), "gateway restarted")
        code, st2 = call(g.base, "GET", "/v1/graph/status")
        check(code == 200 and st2["entities"] == 2 and
              st2["relations"] == 1 and st2["last_sequence"] == 4,
              "after restart: %r" % (st2,))
        meta = server.command("GRAPH.RO_QUERY", "gw_f",
                              "MATCH (m:PCPMeta) RETURN m.applied_sequence")
        check(meta[1] == [[4]], "applied_sequence 4: %r" % (meta,))

        # 4a. FalkorDB down while running: 503 JSON, nothing logged.
        server.stop()
        code, out = call(g.base, "POST", "/v1/graph/mutate",
                         {"mutations": [mutation("carol", "person", "C")]})
        check(code == 503 and isinstance(out, dict) and "error" in out,
              "FalkorDB down -> 503 JSON: %d %r" % (code, out))
        code, out = call(g.base, "POST", "/v1/graph/query", {})
        check(code == 503, "query with FalkorDB down -> 503: %d" % code)
        code, st = call(g.base, "GET", "/v1/graph/status")
        check(code == 503, "status with FalkorDB down -> 503: %d" % code)
        g.stop()
        # 4b. A gateway does not start without its graph database.
        g = Gateway(work, "gw3", config)
        gateways.append(g)
        try:
            rc = g.proc.wait(30)
        except subprocess.TimeoutExpired:
            rc = None
        check(rc not in (None, 0) and "FalkorDB" in g.log(),
              "no start without FalkorDB: rc=%r %r" % (rc, g.log()[-600:]))
        # 4c. FalkorDB back, empty (no persistence): the gateway replays its
        # SQLite log into it at start; the refused mutation was not logged.
        server = falkordb_server.Server(work, port=server.port)
        g = Gateway(work, "gw5", config)
        gateways.append(g)
        check(wait_ready(g.base, g.proc), "gateway restarted on an empty "
              "FalkorDB: " + g.log()[-600:])
        code, st = call(g.base, "GET", "/v1/graph/status")
        check(code == 200 and st["entities"] == 2 and
              st["relations"] == 1 and st["observations"] == 1 and
              st["last_sequence"] == 4,
              "log replayed into the empty graph: %d %r" % (code, st))
        code, e = call(g.base, "GET", "/v1/graph/entities/bob")
        check(code == 200 and e["entities"][0]["display_name"] == hostile,
              "replayed entity intact: %d %r" % (code, e))
        # And once more while running: FalkorDB restarted empty under a
        # running gateway; the next write finds the graph gone and replays.
        server.stop()
        server = falkordb_server.Server(work, port=server.port)
        code, out = call(g.base, "POST", "/v1/graph/mutate",
                         {"mutations": [mutation("dave", "person", "D")]})
        # The first command on the dead connection fails; the next succeeds.
        if code != 200:
            code, out = call(g.base, "POST", "/v1/graph/mutate",
                             {"mutations": [mutation("dave", "person", "D")]})
        code2, st = call(g.base, "GET", "/v1/graph/status")
        check(code == 200 and code2 == 200 and st["entities"] == 3 and
              st["last_sequence"] == 5,
              "replayed under a running gateway: %d %r %r" % (code, out, st))
        g.stop()

        # 4d. AUTH: the password from falkordb.password_env; a wrong one
        # (or an unset variable) stops the gateway at start with a message.
        secured = falkordb_server.Server(work, password="s3cret pass")
        auth_config = dict(config, state_dir=os.path.join(work, "state-auth"),
                           falkordb={"port": secured.port, "graph": "auth",
                                     "password_env": "GRAPH_TEST_FALKOR_PW"})
        os.environ["GRAPH_TEST_FALKOR_PW"] = "wrong"
        g = Gateway(work, "gw6", auth_config)
        gateways.append(g)
        try:
            rc = g.proc.wait(30)
        except subprocess.TimeoutExpired:
            rc = None
        check(rc not in (None, 0) and "AUTH" in g.log(),
              "wrong FalkorDB password refused: rc=%r %r" %
              (rc, g.log()[-600:]))
        os.environ["GRAPH_TEST_FALKOR_PW"] = "s3cret pass"
        g = Gateway(work, "gw7", auth_config)
        gateways.append(g)
        check(wait_ready(g.base, g.proc), "gateway with the FalkorDB "
              "password: " + g.log()[-600:])
        code, out = call(g.base, "POST", "/v1/graph/mutate",
                         {"mutations": [mutation("eve", "person", "E")]})
        check(code == 200, "mutate with AUTH: %d %r" % (code, out))
        g.stop()
        del os.environ["GRAPH_TEST_FALKOR_PW"]
        g = Gateway(work, "gw8", auth_config)
        gateways.append(g)
        try:
            rc = g.proc.wait(30)
        except subprocess.TimeoutExpired:
            rc = None
        check(rc not in (None, 0) and "GRAPH_TEST_FALKOR_PW" in g.log(),
              "unset password variable refused: rc=%r %r" %
              (rc, g.log()[-600:]))
        secured.stop()

        # 5. neo4j refused at config load.
        bad = dict(config, graph_backend="neo4j",
                   neo4j={"uri": "bolt://127.0.0.1:7687", "user": "neo4j"})
        g = Gateway(work, "gw4", bad)
        gateways.append(g)
        try:
            rc = g.proc.wait(30)
        except subprocess.TimeoutExpired:
            rc = None
        log = g.log()
        check(rc not in (None, 0) and "neo4j" in log and "falkordb" in log and
              "sqlite" in log, "neo4j refused: rc=%r %r" % (rc, log[-600:]))
    finally:
        for g in gateways:
            g.stop()
        server.stop()
    if FAILURES:
        print("%d check(s) failed; logs in %s" % (len(FAILURES), work),
              file=sys.stderr)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    print("graph_falkordb_test: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
