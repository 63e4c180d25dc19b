#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The pods of deploy/k8s, run as podman containers of the real image
(issue 19 item 3): what the host-process checks of k8s_manifests_test.py
cannot see is whether the image works under the pods' security settings.

Each pod's settings become podman's: runAsUser/runAsGroup -> --user,
readOnlyRootFilesystem -> --read-only (and no tmpfs podman would add on its
own), capabilities drop ALL -> --cap-drop ALL, allowPrivilegeEscalation
false -> no-new-privileges; volumes are host directories (ConfigMaps
read-only with their data, emptyDirs and claims writable by the pod's
user); env from the manifest (Secrets and the downward API with test
values); args from the manifest with ports free on 127.0.0.1
(--network=host).

1. The gateway and the CPU node manager start; /readyz is 200 on both; the
   worker joins with its node's name in its id.
2. The quickstart model trains 1 outer step (the gateway compiles under
   the read-only root: /tmp and the cache are the pod's volumes).
3. The backup CronJob's container copies the live store: the copy holds the
   finished job and passes integrity_check.
4. SIGTERM (podman stop) ends the gateway with exit 0 within its grace
   period less the preStop sleep.
5. Negative: the gateway pod without its /tmp volume starts, but a
   training job fails to compile, so step 2 can see a missing volume.

Needs the image (`make image`; ctest runs image_cluster, which builds it,
first); a machine that cannot run containers fails with the reason.
Usage: k8s_pods_podman_test.py PCP_BINARY
"""
import copy
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k8s_manifests_test as km  # noqa: E402

RUN_OPTIONS = [
    # The build sandbox lacks CAP_SYS_RESOURCE (ulimits at most what it
    # has) and crun fails on its cgroups (docs/deploy.md "Container image").
    "--runtime", "runc", "--network=host", "--pull=never",
    "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096",
]
FAILURES = km.FAILURES
check = km.check


def fail_now(message):
    print("FAIL:", message, file=sys.stderr)
    sys.exit(1)


def podman(*args, timeout=120, check_rc=True):
    out = subprocess.run(["podman"] + list(args), capture_output=True,
                         text=True, timeout=timeout)
    if check_rc and out.returncode != 0:
        raise RuntimeError("podman %s: %s" % (" ".join(args[:3]),
                                              out.stderr.strip()[-800:]))
    return out


class Pods:
    def __init__(self, bundle, image, work, prefix):
        self.bundle, self.image, self.work = bundle, image, work
        self.prefix = prefix
        self.sandbox = km.Sandbox(bundle, work)
        self.names = []
        self.claims = {}  # claim name -> host dir

    def claim_dir(self, claim, uid, gid):
        if claim not in self.claims:
            d = os.path.join(self.work, "claim-" + claim)
            os.makedirs(d)
            os.chown(d, uid, gid)
            self.claims[claim] = d
        return self.claims[claim]

    def render(self, w, spec, c, instance):
        """The podman run arguments (without the name) for |c|."""
        pod = spec.get("securityContext", {})
        sc = c.get("securityContext", {})
        uid = sc.get("runAsUser", pod.get("runAsUser", 0))
        gid = sc.get("runAsGroup", pod.get("runAsGroup", 0))
        group = pod.get("fsGroup", gid)
        out = list(RUN_OPTIONS) + ["--user", "%d:%d" % (uid, gid)]
        if sc.get("readOnlyRootFilesystem"):
            out += ["--read-only", "--read-only-tmpfs=false"]
        if "ALL" in sc.get("capabilities", {}).get("drop", []):
            out += ["--cap-drop", "ALL"]
        if sc.get("allowPrivilegeEscalation") is False:
            out += ["--security-opt", "no-new-privileges"]
        # Host paths for each volume; ConfigMaps with their data (the ports
        # of a gateway config made free ones by the sandbox).
        base = os.path.join(self.work, "%s-%s" % (w["metadata"]["name"],
                                                  instance))
        claims = {t["metadata"]["name"]: "%s-%s-%s" % (
            t["metadata"]["name"], w["metadata"]["name"], instance)
            for t in w["spec"].get("volumeClaimTemplates", [])}
        for m in c.get("volumeMounts", []):
            volume = [v for v in spec.get("volumes", [])
                      if v["name"] == m["name"]]
            if m["name"] in claims:
                host = self.claim_dir(claims[m["name"]], uid, group)
                mode = "rw"
            elif volume and "persistentVolumeClaim" in volume[0]:
                host = self.claim_dir(
                    volume[0]["persistentVolumeClaim"]["claimName"], uid,
                    group)
                mode = "rw"
            elif volume and "configMap" in volume[0]:
                host = os.path.join(base, m["name"])
                os.makedirs(host, exist_ok=True)
                os.chmod(host, 0o755)
                for cm in km.find(self.bundle, "ConfigMap",
                                  volume[0]["configMap"]["name"]):
                    for key, text in cm.get("data", {}).items():
                        path = os.path.join(host, key)
                        with open(path, "w") as f:
                            f.write(self.sandbox.rewrite_config(
                                text, w, instance))
                        os.chmod(path, 0o644)
                mode = "ro"
            elif volume and "emptyDir" in volume[0]:
                host = os.path.join(base, m["name"])
                os.makedirs(host, exist_ok=True)
                os.chmod(host, 0o777)
                mode = "rw"
            else:
                raise RuntimeError("%s: volume %s of an unknown kind" %
                                   (km.ident(w, c), m["name"]))
            out += ["-v", "%s:%s:%s" % (host, m["mountPath"],
                                        "ro" if m.get("readOnly") else mode)]
        args, env = self.sandbox.prepare(w, spec, c, instance)
        # prepare() maps paths for host processes; a container keeps the
        # manifest's own paths and values.
        args = list(c.get("args", []))
        key = (w["metadata"]["name"], instance)
        if "--api-port" in args:
            i = args.index("--api-port") + 1
            args[i] = str(self.sandbox.port(key, args[i]))
        if "--api-host" in args:
            args[args.index("--api-host") + 1] = "127.0.0.1"
        host = km.arg_value(args, "--host")
        if host is not None:
            local = self.sandbox.fabric_ports.get(
                "%s:%s" % (host, km.arg_value(args, "--port")))
            if local is not None:
                args[args.index("--host") + 1] = "127.0.0.1"
                args[args.index("--port") + 1] = str(local)
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = e["value"]
        for name, value in sorted(env.items()):
            out += ["-e", "%s=%s" % (name, value)]
        if c.get("command"):
            out += ["--entrypoint", c["command"][0], self.image]
            out += c["command"][1:]
        else:
            out.append(self.image)
        return out + args

    def start(self, w, spec, c, instance="0", detach=True):
        name = "%s-%s-%s" % (self.prefix, w["metadata"]["name"], instance)
        argv = self.render(w, spec, c, instance)
        if detach:
            podman("run", "-d", "--name", name, *argv)
            self.names.append(name)
            return name
        return podman("run", "--rm", "--name", name, *argv, timeout=300,
                      check_rc=False)

    def api_port(self, w, c, instance="0"):
        return self.sandbox.ports[((w["metadata"]["name"], instance),
                                   int(km.arg_value(c["args"],
                                                    "--api-port")))]

    def logs(self, name):
        out = podman("logs", name, check_rc=False)
        return (out.stdout + out.stderr)[-3000:]

    def remove(self):
        for name in self.names:
            podman("rm", "-f", "-t", "0", name, check_rc=False)
        self.names = []


def workload(bundle, kind, name):
    w = km.find(bundle, kind, name)[0]
    t = w["spec"]["jobTemplate"]["spec"]["template"] if kind == "CronJob" \
        else w["spec"]["template"]
    return w, t["spec"], t["spec"]["containers"][0]


def start_gateway(pods, bundle):
    w, spec, c = workload(bundle, "StatefulSet", "pcp-gateway")
    name = pods.start(w, spec, c)
    port = pods.api_port(w, c)
    config = km.gateway_config_of(bundle, c)
    fabric = pods.sandbox.port((w["metadata"]["name"], "0"),
                               config["worker_fabric"]["port"])
    for svc in km.find(bundle, "Service", "pcp-gateway-fabric"):
        for p in svc["spec"]["ports"]:
            pods.sandbox.fabric_ports["%s.%s.svc.cluster.local:%s" % (
                svc["metadata"]["name"], svc["metadata"]["namespace"],
                p["port"])] = fabric
    ok = km.wait_for(lambda: km.http_get(port, "/readyz")[0] == 200, 90)
    check(ok, "the gateway container's /readyz is not 200 within 90 s:\n" +
          pods.logs(name))
    return w, c, name, port


def submit(binary, port, token, work, steps, timeout_s=300):
    with open(os.path.join(km.SOURCE, "examples",
                           "quickstart_train.json")) as f:
        exp = json.load(f)
    # A few outer steps; the schedule fitted to them.
    exp.update(outer_loop_steps=steps, warmup_steps=2, eval_every=steps,
               checkpoint_every=steps, tau=5)
    path = os.path.join(work, "exp.json")
    with open(path, "w") as f:
        json.dump(exp, f)
    env = dict(os.environ, PCP_TEST_API_TOKEN=token)
    return subprocess.run(
        [binary, "submit", "train", path, "--gateway",
         "http://127.0.0.1:%d" % port, "--api-token-env",
         "PCP_TEST_API_TOKEN"], capture_output=True, text=True, env=env,
        timeout=timeout_s)


def put_data(pods, bundle):
    """The quickstart's data_path is relative: the gateway's working
    directory, /var/lib/pcp (the image's), on the state claim."""
    w, _, _ = workload(bundle, "StatefulSet", "pcp-gateway")
    state = pods.claims["state-%s-0" % w["metadata"]["name"]]
    data = os.path.join(state, "data")
    os.makedirs(data, exist_ok=True)
    shutil.copy(os.path.join(km.SOURCE, "data", "tiny_shakespeare.txt"), data)
    for d, _, files in os.walk(data):
        os.chown(d, 10001, 10001)
        for f in files:
            os.chown(os.path.join(d, f), 10001, 10001)


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else os.environ["PCP_BINARY"]
    for tool, why in (("podman", "podman"), ("runc", "runc")):
        if not shutil.which(tool):
            fail_now("%s is not installed: this machine cannot run "
                     "containers ('make setup' installs it)" % why)
    info = podman("info", check_rc=False)
    if info.returncode != 0:
        fail_now("podman cannot run containers here: %s" %
                 info.stderr.strip()[-500:])
    pcp = km.Pcp(binary)
    if podman("image", "exists", pcp.image, check_rc=False).returncode != 0:
        fail_now("no image %s: run 'make image' first (in `make test`, "
                 "image_cluster builds it before this test)" % pcp.image)
    bundle = km.load(km.MANIFESTS)
    work = tempfile.mkdtemp(prefix="pcp-k8s-pods-")
    os.chmod(work, 0o755)
    prefix = "pcp-k8s-pods-%d" % os.getpid()
    pods = Pods(bundle, pcp.image, work, prefix)
    try:
        # 1. Gateway and CPU node manager.
        gw, gc, gw_name, port = start_gateway(pods, bundle)
        token = "test-pcp-tokens-api-token"
        w, spec, c = workload(bundle, "DaemonSet", "pcp-node-manager-cpu")
        nm_name = pods.start(w, spec, c)
        nm_port = pods.api_port(w, c)
        ok = km.wait_for(lambda: km.http_get(nm_port, "/readyz")[0] == 200,
                         90)
        check(ok, "the node manager container's /readyz is not 200 within "
              "90 s:\n" + pods.logs(nm_name))

        def joined():
            s, body = km.http_get(port, "/v1/workers", token)
            return s == 200 and [x["worker_id"] for x in
                                 json.loads(body)["workers"]
                                 if x["state"] == "connected"]

        ids = km.wait_for(joined, 60) and joined()
        check(ids and all("node-0" in i for i in ids),
              "the worker did not join with its node's name: %s" % ids)
        print("pods: gateway and node manager ready, workers %s" % ids)

        # 2. Training under the read-only root.
        put_data(pods, bundle)
        start = time.monotonic()
        out = submit(binary, port, token, work, 1)
        check(out.returncode == 0 and "succeeded" in out.stdout,
              "training in the pods failed (exit %d): %s\n%s" %
              (out.returncode, (out.stdout + out.stderr)[-1500:],
               pods.logs(gw_name)))
        print("pods: quickstart trained 1 outer step in %.0f s" %
              (time.monotonic() - start))

        # 3. The backup CronJob's container on the live store.
        bw, bspec, bc = workload(bundle, "CronJob", "pcp-gateway-backup")
        out = pods.start(bw, bspec, bc, detach=False)
        check(out.returncode == 0, "the backup container failed (exit %d): "
              "%s" % (out.returncode, (out.stdout + out.stderr)[-800:]))
        backups = [os.path.join(pods.claims["pcp-gateway-backup"], f)
                   for f in os.listdir(pods.claims.get(
                       "pcp-gateway-backup", work))
                   if f.startswith("pcp-") and f.endswith(".db")] \
            if "pcp-gateway-backup" in pods.claims else []
        if check(len(backups) == 1, "want one backup, got %s" % backups):
            db = sqlite3.connect(backups[0])
            states = [r[0] for r in db.execute(
                "SELECT state FROM jobs WHERE kind = 'training'")]
            ok = db.execute("PRAGMA integrity_check").fetchone()[0]
            db.close()
            check(states == ["succeeded"] and ok == "ok",
                  "the backup holds training jobs %s, integrity %s" %
                  (states, ok))
            print("pods: backup %s holds the job (%s), integrity %s" %
                  (os.path.basename(backups[0]), states, ok))

        # 4. SIGTERM within the grace period.
        grace = gw["spec"]["template"]["spec"][
            "terminationGracePeriodSeconds"]
        sleep_s = gc["lifecycle"]["preStop"]["sleep"]["seconds"]
        start = time.monotonic()
        podman("stop", "-t", str(grace - sleep_s), gw_name,
               timeout=grace + 30)
        took = time.monotonic() - start
        rc = podman("inspect", gw_name, "--format",
                    "{{.State.ExitCode}}").stdout.strip()
        check(rc == "0" and took < grace - sleep_s,
              "gateway container after SIGTERM: exit %s after %.1f s" %
              (rc, took))
        print("pods: gateway SIGTERM to exit %.1f s, exit %s" % (took, rc))
        pods.remove()

        # 5. Negative: no /tmp volume on the read-only root.
        mutated = copy.deepcopy(bundle)
        _, _, mc = workload(mutated, "StatefulSet", "pcp-gateway")
        mc["volumeMounts"] = [m for m in mc["volumeMounts"]
                              if m["mountPath"] != "/tmp"]
        bad = Pods(mutated, pcp.image, tempfile.mkdtemp(dir=work),
                   prefix + "-neg")
        try:
            _, _, bad_name, bad_port = start_gateway(bad, mutated)
            w, spec, c = workload(mutated, "DaemonSet",
                                  "pcp-node-manager-cpu")
            bad.start(w, spec, c)
            check(km.wait_for(lambda: km.http_get(
                bad_port, "/v1/workers", token)[1].count(b'"connected"'),
                90), "negative: no worker joined the second gateway")
            put_data(bad, mutated)
            out = submit(binary, bad_port, token, bad.work, 1, 150)
            last = (out.stdout + out.stderr).strip().splitlines()[-1:]
            # The compiler's mkdtemp under /tmp is what fails.
            logs = [os.path.join(d, f) for d, _, fs in os.walk(
                bad.claims["state-pcp-gateway-0"]) for f in fs
                if f.startswith("compile-") and f.endswith(".log")]
            text = "".join(open(f, errors="replace").read() for f in logs)
            check(out.returncode != 0 and "compile" in " ".join(last) and
                  "temp directory: Read-only file system" in text,
                  "negative: a gateway pod without /tmp: exit %d, %s, "
                  "compile log %r" % (out.returncode, last, text[-500:]))
            print("pods: negative (no /tmp volume): training failed: %s" %
                  last)
        finally:
            bad.remove()
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        check(False, str(e))
    finally:
        pods.remove()
        if not FAILURES:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("kept", work, file=sys.stderr)
    if FAILURES:
        print("%d failure(s)" % len(FAILURES), file=sys.stderr)
        return 1
    print("k8s pods in podman: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
