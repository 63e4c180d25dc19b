#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""deploy/k8s validated offline (issue 19 item 3).

1. Every manifest passes `kubernetes-validate --strict` for each Kubernetes
   version in KUBERNETES_VERSIONS (a resource without a schema, such as a
   misspelt apiVersion, is a failure, not the tool's warning).
2. The semantic checks the schemas miss, each in its own function that
   returns the problems it found:
     kustomization  it lists every manifest but the example Secret
     selectors      workload and PDB selectors match pod template labels;
                    a StatefulSet's serviceName is a headless Service
     services       every Service selects a pod template and targets a port
                    its containers declare
     images         every image is localhost/pcp:<`pcp version`>, never pulled
     args           the real binary accepts every container's arguments
                    (`pcp ARGS --dump-config`, paths mapped to a temp dir)
     env            every *_env name the role reads (the dumped config, the
                    worker's join token default) is set in the pod; every
                    secretKeyRef names a key of secrets.example.yaml
     config_paths   --gateway-config is a key of a mounted ConfigMap; every
                    path of the config lies on a mounted volume, state_dir
                    on the volumeClaimTemplate
     security       uid 10001, non-root, seccomp, no privilege escalation,
                    read-only root with /tmp and PCP_CACHE_DIR mounted, ALL caps
                    dropped, no Service links (their names share PCP_),
                    requests and a memory limit
     memory         max_job_gateway_bytes set and below the memory limit
     fabric         the node managers' --host/--port is a Service of the
                    gateway's fabric port that publishes not-ready pods
     gpu            the GPU variant: cuda, a GPU node selector, the
                    nvidia.com/gpu toleration, --scale == nvidia.com/gpu
     worker_ids     two nodes' workers get different ids (the real
                    `pcp --worker --dump-config` with the downward-API env)
     drain          grace periods cover preStop + docs/api.md's drain and
                    the node manager's --stop-grace-ms
     claims         every mounted claim exists (a PVC or a StatefulSet
                    pod's); another pod mounting the gateway's
                    ReadWriteOnce claim is tied to its node by podAffinity
     backup         the backup CronJob's script, run on the live gateway's
                    state directory, copies a row written just before
     probes         the real gateway and node managers, started from the
                    manifests' args, env and config, answer every probe
                    path on the probe's port (/healthz 200, /readyz 200 or
                    503 with a JSON body, never 404); the CPU node manager's
                    worker joins the gateway with the manifests' tokens
3. Each check fails on a mutated copy of the manifests (the "negative"
   list), so the checker is seen to fail.
4. The gateway started from the manifests drains on SIGTERM and exits 0
   within its grace period less the preStop sleep.

Usage: k8s_manifests_test.py PCP_BINARY [--roles gateway,node-manager]
  --roles limits the real-process checks (args, env, probes) to the named
  roles' containers; deploy_k8s_hub runs the federation hub's part.
Every wait is bounded.
"""
import copy
import glob
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

try:
    import yaml
except ImportError:
    # PyYAML comes with kubernetes-validate (tools/setup/requirements-test.txt).
    print("FAIL: PyYAML is not installed in %s (install it: `make setup` "
          "does)" % sys.executable, file=sys.stderr)
    sys.exit(1)

KUBERNETES_VERSIONS = ["1.30.0", "1.33.0"]
SOURCE = os.environ.get("PCP_SOURCE_DIR") or os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MANIFESTS = os.path.join(SOURCE, "deploy", "k8s")
ROLE_FLAGS = {"--gateway": "gateway", "--node-manager": "node-manager",
              "--federation-hub": "federation-hub"}
UID = 10001
# docs/api.md "Signals": /readyz 503 for 1 s, completions up to 8 s, then
# requests in flight up to 10 s.
GATEWAY_DRAIN_S = 1 + 8 + 10
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, file=sys.stderr)
    return cond


#===----------------------------------------------------------------------===#
# The manifests
#===----------------------------------------------------------------------===#


def load(directory):
    """{file name: [documents]} of every *.yaml in |directory|."""
    out = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.yaml"))):
        with open(path) as f:
            out[os.path.basename(path)] = [d for d in yaml.safe_load_all(f)
                                           if d is not None]
    return out


def resources(bundle):
    """Every Kubernetes object (the kustomization left out)."""
    for name, docs in bundle.items():
        if name == "kustomization.yaml":
            continue
        for doc in docs:
            yield doc


def find(bundle, kind, name=None):
    return [d for d in resources(bundle) if d.get("kind") == kind and
            (name is None or d["metadata"]["name"] == name)]


def pod_templates(bundle):
    """(workload, pod template) for every Deployment, StatefulSet, DaemonSet,
    and the CronJobs' job templates."""
    for d in resources(bundle):
        kind = d.get("kind")
        if kind in ("Deployment", "StatefulSet", "DaemonSet"):
            yield d, d["spec"]["template"]
        elif kind == "CronJob":
            yield d, d["spec"]["jobTemplate"]["spec"]["template"]


def containers(bundle):
    """(workload, pod spec, container) of every container."""
    for w, t in pod_templates(bundle):
        spec = t["spec"]
        for c in spec.get("initContainers", []) + spec["containers"]:
            yield w, spec, c


def role_of(container):
    args = container.get("args", [])
    return ROLE_FLAGS.get(args[0]) if args else None


def ident(w, c):
    return "%s/%s container %s" % (w["kind"], w["metadata"]["name"],
                                   c["name"])


def arg_value(args, flag):
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a[len(flag) + 1:]
    return None


def labels_match(selector, labels):
    return bool(selector) and all(labels.get(k) == v
                                  for k, v in selector.items())


def gateway_config_of(bundle, c):
    """The gateway config JSON a gateway container reads (None when its
    --gateway-config is not a mounted ConfigMap key)."""
    path = arg_value(c.get("args", []), "--gateway-config")
    source = configmap_file(bundle, c, path)
    return json.loads(source) if source is not None else None


def configmap_file(bundle, c, path):
    """The text of |path| in container |c| when a ConfigMap volume of its
    pod (|c| must be a container of |bundle|) holds it, else None."""
    spec = None
    for _, s, cc in containers(bundle):
        if cc is c:
            spec = s
    if not path or spec is None:
        return None
    for m in c.get("volumeMounts", []):
        if os.path.dirname(path) != m["mountPath"].rstrip("/"):
            continue
        for v in spec.get("volumes", []):
            if v["name"] == m["name"] and "configMap" in v:
                for cm in find(bundle, "ConfigMap", v["configMap"]["name"]):
                    return cm.get("data", {}).get(os.path.basename(path))
    return None


def env_names(c):
    return {e["name"] for e in c.get("env", [])}


def container_ports(c):
    return {p.get("name"): p["containerPort"] for p in c.get("ports", [])}


def resolve_port(c, port):
    """A probe's or Service's port (name or number) as a declared
    containerPort, or None."""
    ports = container_ports(c)
    if isinstance(port, str):
        return ports.get(port)
    return port if port in ports.values() else None


def mount_for(c, path):
    """The volumeMount holding |path| (longest prefix), or None."""
    best = None
    for m in c.get("volumeMounts", []):
        mp = m["mountPath"].rstrip("/")
        if path == mp or path.startswith(mp + "/"):
            if best is None or len(mp) > len(best["mountPath"]):
                best = m
    return best


#===----------------------------------------------------------------------===#
# The real binary
#===----------------------------------------------------------------------===#


class Pcp:
    def __init__(self, binary):
        self.binary = binary
        out = subprocess.run([binary, "version"], capture_output=True,
                             text=True, timeout=60)
        first = out.stdout.splitlines()[0] if out.stdout else ""
        check(out.returncode == 0 and first.startswith("pcp "),
              "`pcp version` failed: %r %r" % (out.stdout, out.stderr))
        self.version = first[len("pcp "):].strip()
        self.image = "localhost/pcp:" + self.version
        worker = self.dump(["--worker"], {})
        self.worker_join_token_env = (
            worker["flags"]["join_token_env"] if worker else None)

    def dump(self, args, env):
        """`pcp ARGS --dump-config` as JSON; None (and the message) when
        the binary refuses the arguments."""
        full = dict(os.environ)
        full.update(env)
        out = subprocess.run([self.binary] + args + ["--dump-config"],
                             capture_output=True, text=True, env=full,
                             timeout=60)
        if out.returncode != 0:
            self.last_error = out.stderr.strip() or out.stdout.strip()
            return None
        return json.loads(out.stdout)


class Sandbox:
    """Maps a container onto this machine: each volumeMount becomes a
    directory of a temp dir (ConfigMap volumes filled with their data),
    strings under a mount path are rewritten to it, listen ports become
    free ports, Service DNS names 127.0.0.1."""

    def __init__(self, bundle, root):
        self.bundle, self.root = bundle, root
        self.ports = {}  # (pod key, container port) -> local port
        self.fabric_ports = {}  # Service DNS name:port -> local port

    def port(self, key, container_port):
        k = (key, int(container_port))
        if k not in self.ports:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.ports[k] = s.getsockname()[1]
        return self.ports[k]

    def prepare(self, w, spec, c, instance):
        """(args, env) to run |c| here as pod |instance|."""
        base = os.path.join(self.root, "%s-%s" % (w["metadata"]["name"],
                                                  instance))
        mounts = {}
        for m in c.get("volumeMounts", []):
            host = os.path.join(base, m["name"])
            os.makedirs(host, exist_ok=True)
            mounts[m["mountPath"].rstrip("/")] = host
            for v in spec.get("volumes", []):
                if v["name"] == m["name"] and "configMap" in v:
                    for cm in find(self.bundle, "ConfigMap",
                                   v["configMap"]["name"]):
                        for key, text in cm.get("data", {}).items():
                            with open(os.path.join(host, key), "w") as f:
                                f.write(self.rewrite_config(
                                    text, w, instance))

        def path(s):
            for mp in sorted(mounts, key=len, reverse=True):
                if s == mp or s.startswith(mp + "/"):
                    return mounts[mp] + s[len(mp):]
            return s

        args = [path(a) for a in c.get("args", [])]
        key = (w["metadata"]["name"], instance)
        if "--api-port" in args:
            i = args.index("--api-port") + 1
            args[i] = str(self.port(key, args[i]))
        if "--api-host" in args:
            args[args.index("--api-host") + 1] = "127.0.0.1"
        host = arg_value(args, "--host")
        if host is not None:
            port = arg_value(args, "--port")
            local = self.fabric_ports.get("%s:%s" % (host, port))
            if local is not None:
                args[args.index("--host") + 1] = "127.0.0.1"
                args[args.index("--port") + 1] = str(local)
        env = {}
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = path(e["value"])
            elif "secretKeyRef" in e["valueFrom"]:
                ref = e["valueFrom"]["secretKeyRef"]
                env[e["name"]] = "test-%s-%s" % (ref["name"], ref["key"])
            elif "fieldRef" in e["valueFrom"]:
                field = e["valueFrom"]["fieldRef"]["fieldPath"]
                env[e["name"]] = {
                    "metadata.name": "%s-%s" % (w["metadata"]["name"],
                                                instance),
                    "metadata.namespace": w["metadata"].get("namespace",
                                                            "default"),
                    "spec.nodeName": "node-%s" % instance,
                }.get(field, "field-" + field)
        return args, env

    def rewrite_config(self, text, w, instance):
        try:
            config = json.loads(text)
        except ValueError:
            return text
        # Listen ports here; the paths are mapped by map_config_paths once
        # every mount has its directory.
        key = (w["metadata"]["name"], instance)
        fabric = config.get("worker_fabric", {})
        if "port" in fabric:
            fabric["port"] = self.port(key, fabric["port"])
        if "host" in fabric:
            fabric["host"] = "127.0.0.1"
        return json.dumps(config)


def map_config_paths(config_path, mounts):
    """Rewrites the absolute paths of a written gateway config to |mounts|
    (path -> host dir); directories are created."""
    with open(config_path) as f:
        config = json.load(f)

    def path(s):
        for mp in sorted(mounts, key=len, reverse=True):
            if s == mp or s.startswith(mp + "/"):
                out = mounts[mp] + s[len(mp):]
                os.makedirs(out, exist_ok=True)
                return out
        return s

    for k in ("state_dir",):
        if k in config:
            config[k] = path(config[k])
    for k in ("data_roots", "model_roots"):
        if k in config:
            config[k] = [path(p) for p in config[k]]
    with open(config_path, "w") as f:
        json.dump(config, f)


def http_get(port, path, token=None, timeout=5):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path))
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return None, b""


def wait_for(pred, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.2)
    return pred()


#===----------------------------------------------------------------------===#
# Checks: each returns a list of problems
#===----------------------------------------------------------------------===#


def run_validate(directory, names):
    tool = os.path.join(os.path.dirname(sys.executable), "kubernetes-validate")
    if not os.path.exists(tool):
        tool = shutil.which("kubernetes-validate")
    if not tool:
        return ["kubernetes-validate is not installed (install it: `make "
                "setup` does, tools/setup/requirements-test.txt)"]
    problems = []
    files = [os.path.join(directory, n) for n in names]
    for version in KUBERNETES_VERSIONS:
        out = subprocess.run([tool, "--strict", "-k", version] + files,
                             capture_output=True, text=True, timeout=120)
        text = out.stdout + out.stderr
        if out.returncode != 0:
            problems.append("kubernetes-validate --strict -k %s: %s" %
                            (version, text.strip()))
        elif "WARN" in text or "ERROR" in text:
            # An unknown kind or apiVersion is only a warning to the tool.
            problems.append("kubernetes-validate -k %s warned: %s" %
                            (version, text.strip()))
    return problems


def check_schema(bundle, directory):
    names = [n for n in bundle if n != "kustomization.yaml"]
    return run_validate(directory, names)


def check_kustomization(bundle, _):
    k = bundle.get("kustomization.yaml")
    if not k:
        return ["no kustomization.yaml"]
    listed = set(k[0].get("resources", []))
    wanted = {n for n in bundle if n != "kustomization.yaml" and
              not n.endswith(".example.yaml")}
    problems = ["kustomization.yaml does not list %s" % n
                for n in sorted(wanted - listed)]
    problems += ["kustomization.yaml lists %s, which is not a manifest here "
                 "(or is an example)" % n for n in sorted(listed - wanted)]
    return problems


def check_selectors(bundle, _):
    problems = []
    templates = []
    for w, t in pod_templates(bundle):
        labels = t.get("metadata", {}).get("labels", {})
        templates.append((w, labels))
        if w["kind"] == "CronJob":
            continue
        sel = w["spec"]["selector"].get("matchLabels", {})
        if not labels_match(sel, labels):
            problems.append("%s/%s: selector %s does not match its pod "
                            "template labels %s" % (w["kind"],
                                                    w["metadata"]["name"],
                                                    sel, labels))
        if w["kind"] == "StatefulSet":
            svc = find(bundle, "Service", w["spec"].get("serviceName"))
            if not svc or svc[0]["spec"].get("clusterIP") != "None":
                problems.append("StatefulSet/%s: serviceName %r is not a "
                                "headless Service here" %
                                (w["metadata"]["name"],
                                 w["spec"].get("serviceName")))
    for pdb in find(bundle, "PodDisruptionBudget"):
        sel = pdb["spec"]["selector"].get("matchLabels", {})
        if not any(labels_match(sel, l) for _, l in templates):
            problems.append("PodDisruptionBudget/%s: selector %s matches no "
                            "pod template" % (pdb["metadata"]["name"], sel))
    return problems


def check_services(bundle, _):
    problems = []
    for svc in find(bundle, "Service"):
        sel = svc["spec"].get("selector", {})
        pods = [(w, t) for w, t in pod_templates(bundle)
                if w.get("metadata", {}).get("namespace") ==
                svc["metadata"].get("namespace") and
                labels_match(sel, t["metadata"].get("labels", {}))]
        name = "Service/%s" % svc["metadata"]["name"]
        if not pods:
            problems.append("%s: selector %s matches no pod template" %
                            (name, sel))
            continue
        for p in svc["spec"]["ports"]:
            target = p.get("targetPort", p["port"])
            for w, t in pods:
                if not any(resolve_port(c, target) for c in
                           t["spec"]["containers"]):
                    problems.append("%s: port %s targets %r, which no "
                                    "container of %s/%s declares" %
                                    (name, p.get("name"), target, w["kind"],
                                     w["metadata"]["name"]))
    return problems


def check_images(bundle, ctx):
    problems = []
    for w, _, c in containers(bundle):
        if c["image"] != ctx.pcp.image:
            problems.append("%s: image %s, but `make image` tags %s" %
                            (ident(w, c), c["image"], ctx.pcp.image))
        if c.get("imagePullPolicy") != "Never":
            problems.append("%s: imagePullPolicy %r; the image is loaded "
                            "onto the nodes, there is no registry to pull "
                            "from (Never)" % (ident(w, c),
                                              c.get("imagePullPolicy")))
    return problems


def dump_container(bundle, ctx, w, spec, c):
    """The container's `--dump-config` through the sandbox, or the error."""
    sandbox = Sandbox(bundle, tempfile.mkdtemp(dir=ctx.work))
    args, env = sandbox.prepare(w, spec, c, "dump")
    config = arg_value(args, "--gateway-config")
    if config and os.path.exists(config):
        map_config_paths(config, {m["mountPath"]: os.path.join(
            os.path.dirname(os.path.dirname(config)), m["name"])
            for m in c.get("volumeMounts", [])})
    return ctx.pcp.dump(args, env), args


def check_args(bundle, ctx):
    problems = []
    for w, spec, c in containers(bundle):
        role = role_of(c)
        if role not in ctx.roles:
            if role is None and w["kind"] != "CronJob":
                problems.append("%s: args do not start with a role flag "
                                "(%s)" % (ident(w, c), ", ".join(ROLE_FLAGS)))
            continue
        dumped, args = dump_container(bundle, ctx, w, spec, c)
        if dumped is None:
            problems.append("%s: `pcp %s` is refused: %s" %
                            (ident(w, c), " ".join(c["args"]),
                             ctx.pcp.last_error))
    return problems


def env_refs(value, path=""):
    """(key path, value) of every *_env key with a string value."""
    if isinstance(value, dict):
        for k, v in value.items():
            p = path + "." + k if path else k
            if k.endswith("_env") and isinstance(v, str) and v:
                yield p, v
            else:
                yield from env_refs(v, p)


def check_env(bundle, ctx):
    problems = []
    secret_keys = {}
    for s in find(bundle, "Secret"):
        secret_keys[s["metadata"]["name"]] = set(
            s.get("stringData", {})) | set(s.get("data", {}))
    for w, spec, c in containers(bundle):
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref and ref["key"] not in secret_keys.get(ref["name"], ()):
                problems.append("%s: env %s reads key %r of Secret %r, which "
                                "secrets.example.yaml does not define" %
                                (ident(w, c), e["name"], ref["key"],
                                 ref["name"]))
        role = role_of(c)
        if role not in ctx.roles:
            continue
        dumped, _ = dump_container(bundle, ctx, w, spec, c)
        if dumped is None:
            continue  # check_args reports it
        wanted = dict(env_refs(dumped))
        for i, a in enumerate(c["args"]):
            if a.endswith("-token-env") and i + 1 < len(c["args"]):
                wanted[a] = c["args"][i + 1]
        if role == "node-manager":
            # Its workers run with --join-token-env's default and inherit
            # the node manager's environment.
            wanted["pcp --worker --join-token-env (default)"] = \
                ctx.pcp.worker_join_token_env
        for key, name in sorted(wanted.items()):
            if name not in env_names(c):
                problems.append("%s: %s names the variable %s, which the pod "
                                "does not set" % (ident(w, c), key, name))
    return problems


def check_config_paths(bundle, _):
    problems = []
    for w, spec, c in containers(bundle):
        if role_of(c) != "gateway":
            continue
        path = arg_value(c["args"], "--gateway-config")
        config = gateway_config_of(bundle, c)
        if config is None:
            problems.append("%s: --gateway-config %s is not a key of a "
                            "ConfigMap mounted there" % (ident(w, c), path))
            continue
        paths = [("state_dir", config.get("state_dir"))]
        paths += [("data_roots", p) for p in config.get("data_roots", [])]
        paths += [("model_roots", p) for p in config.get("model_roots", [])]
        for key in ("cert", "key"):
            if config.get("tls", {}).get(key):
                paths.append(("tls." + key, config["tls"][key]))
        for key, p in paths:
            if not p or not mount_for(c, p):
                problems.append("%s: config key %s (%s) is on no mounted "
                                "volume" % (ident(w, c), key, p))
        m = mount_for(c, config.get("state_dir") or "/")
        claims = [t["metadata"]["name"] for t in
                  w["spec"].get("volumeClaimTemplates", [])]
        if not m or m["name"] not in claims or m.get("readOnly"):
            problems.append("%s: state_dir %s is not on a writable "
                            "volumeClaimTemplate volume" %
                            (ident(w, c), config.get("state_dir")))
    return problems


def check_security(bundle, _):
    problems = []
    for w, spec, c in containers(bundle):
        name = ident(w, c)
        pod = spec.get("securityContext", {})
        sc = c.get("securityContext", {})

        def get(key):
            return sc.get(key, pod.get(key))

        if get("runAsUser") != UID or get("runAsNonRoot") is not True:
            problems.append("%s: not runAsNonRoot with runAsUser %d (the "
                            "image's user)" % (name, UID))
        # The namespace enforces the restricted Pod Security Standard.
        if get("seccompProfile") not in ({"type": "RuntimeDefault"},) and \
                (get("seccompProfile") or {}).get("type") != "Localhost":
            problems.append("%s: no RuntimeDefault or Localhost "
                            "seccompProfile (restricted Pod Security)" % name)
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append("%s: allowPrivilegeEscalation is not false" % name)
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            problems.append("%s: capabilities do not drop ALL" % name)
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append("%s: readOnlyRootFilesystem is not true" % name)
        # The compiler's scratch space is /tmp (mkdtemp), the program cache
        # PCP_CACHE_DIR: both must be writable volumes on a read-only root.
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        if role_of(c) in ("gateway", "node-manager"):
            for what, path in (("/tmp", "/tmp"),
                               ("PCP_CACHE_DIR", env.get("PCP_CACHE_DIR"))):
                m = mount_for(c, path) if path else None
                if not m or m.get("readOnly"):
                    problems.append("%s: %s (%s) is not a writable volume "
                                    "on the read-only root" %
                                    (name, what, path))
        if spec.get("enableServiceLinks") is not False:
            problems.append("%s: enableServiceLinks is not false (Service "
                            "links would set PCP_* variables)" % name)
        res = c.get("resources", {})
        for key in ("cpu", "memory"):
            if key not in res.get("requests", {}):
                problems.append("%s: no %s request" % (name, key))
        if "memory" not in res.get("limits", {}):
            problems.append("%s: no memory limit" % name)
    return problems


UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
         "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "": 1}


def quantity_bytes(q):
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T|)", str(q))
    return int(m.group(1)) * UNITS[m.group(2)] if m else None


def check_memory(bundle, _):
    problems = []
    for w, spec, c in containers(bundle):
        if role_of(c) != "gateway":
            continue
        config = gateway_config_of(bundle, c) or {}
        limit = quantity_bytes(
            c.get("resources", {}).get("limits", {}).get("memory"))
        cap = config.get("max_job_gateway_bytes", 0)
        # 0 means half of MemTotal, which in a container is the node's.
        if not cap or limit is None or cap >= limit:
            problems.append("%s: max_job_gateway_bytes %s must be set and "
                            "below the memory limit (%s bytes), or an "
                            "admitted job can OOM-kill the gateway" %
                            (ident(w, c), cap, limit))
    return problems


def service_by_dns(bundle, host):
    parts = host.split(".")
    for svc in find(bundle, "Service"):
        ns = svc["metadata"].get("namespace", "default")
        if parts[0] == svc["metadata"]["name"] and (
                len(parts) == 1 or parts[1] == ns):
            return svc
    return None


def check_fabric(bundle, _):
    problems = []
    gateways = [(w, c) for w, _, c in containers(bundle)
                if role_of(c) == "gateway"]
    for w, spec, c in containers(bundle):
        if role_of(c) != "node-manager":
            continue
        host = arg_value(c["args"], "--host")
        port = int(arg_value(c["args"], "--port") or 8080)
        svc = service_by_dns(bundle, host or "")
        if not svc:
            problems.append("%s: --host %s is not a Service here" %
                            (ident(w, c), host))
            continue
        sp = [p for p in svc["spec"]["ports"] if p["port"] == port]
        if not sp:
            problems.append("%s: Service %s has no port %d" %
                            (ident(w, c), svc["metadata"]["name"], port))
            continue
        if svc["spec"].get("publishNotReadyAddresses") is not True:
            problems.append("Service/%s: the worker fabric must publish "
                            "not-ready addresses (the gateway's /readyz "
                            "waits for the workers it routes)" %
                            svc["metadata"]["name"])
        target = sp[0].get("targetPort", port)
        for gw, gc in gateways:
            if not labels_match(svc["spec"].get("selector", {}),
                                gw["spec"]["template"]["metadata"]["labels"]):
                continue
            config = gateway_config_of(bundle, gc) or {}
            fabric_port = config.get("worker_fabric", {}).get("port", 8080)
            if resolve_port(gc, target) != fabric_port:
                problems.append("%s: --host %s:%d reaches container port %s "
                                "of %s, but its worker fabric listens on %d"
                                % (ident(w, c), host, port,
                                   resolve_port(gc, target), ident(gw, gc),
                                   fabric_port))
    return problems


def check_gpu(bundle, _):
    problems = []
    for w, spec, c in containers(bundle):
        if role_of(c) != "node-manager":
            continue
        gpus = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        backend = arg_value(c["args"], "--backend")
        if gpus is None and backend != "cuda":
            continue
        name = ident(w, c)
        scale = int(arg_value(c["args"], "--scale") or 1)
        if backend != "cuda" or gpus is None:
            problems.append("%s: --backend %s with nvidia.com/gpu %s: a GPU "
                            "pod needs both" % (name, backend, gpus))
            continue
        if int(gpus) != scale:
            problems.append("%s: --scale %d workers but nvidia.com/gpu %s: "
                            "one worker per GPU" % (name, scale, gpus))
        if not arg_value(c["args"], "--target"):
            problems.append("%s: no --target (the GPU architecture)" % name)
        selector = spec.get("nodeSelector", {})
        affinity = json.dumps(spec.get("affinity", {}))
        if not any(k.startswith("nvidia.com/gpu") for k in selector) and \
                "nvidia.com/gpu" not in affinity:
            problems.append("%s: no node selector or affinity on an "
                            "nvidia.com/gpu label" % name)
        if not any(t.get("key") == "nvidia.com/gpu"
                   for t in spec.get("tolerations", [])):
            problems.append("%s: no toleration of the nvidia.com/gpu taint"
                            % name)
    return problems


def check_worker_ids(bundle, ctx):
    problems = []
    for w, spec, c in containers(bundle):
        if role_of(c) != "node-manager" or "node-manager" not in ctx.roles:
            continue
        ids = []
        for instance in ("a", "b"):
            _, env = Sandbox(bundle, ctx.work).prepare(w, spec, c, instance)
            args = ["--worker", "--backend",
                    arg_value(c["args"], "--backend") or "auto"]
            if arg_value(c["args"], "--target"):
                args += ["--target", arg_value(c["args"], "--target")]
            dumped = ctx.pcp.dump(args, env)
            ids.append(dumped["effective"]["worker_id"] if dumped else None)
        # Unique per pod, and naming the node so that an operator finds
        # the worker of a /v1/workers record.
        if ids[0] is None or ids[0] == ids[1] or not all(
                "node-" + i in ids[k] for k, i in enumerate(("a", "b"))):
            problems.append("%s: worker ids %s are not one per node with the "
                            "node's name; set NODE_NAME, POD_NAME and "
                            "POD_NAMESPACE from the downward API" %
                            (ident(w, c), ids))
    return problems


def check_drain(bundle, _):
    problems = []
    for w, spec, c in containers(bundle):
        grace = spec.get("terminationGracePeriodSeconds", 30)
        role = role_of(c)
        pre = c.get("lifecycle", {}).get("preStop", {})
        sleep_s = pre.get("sleep", {}).get("seconds", 0)
        if role == "gateway":
            if not sleep_s:
                problems.append("%s: no preStop sleep (load balancers need "
                                "a moment before the drain)" % ident(w, c))
            need = sleep_s + GATEWAY_DRAIN_S + 5
            if grace < need:
                problems.append("%s: terminationGracePeriodSeconds %d < "
                                "preStop %d s + the %d s SIGTERM drain + "
                                "5 s" % (ident(w, c), grace, sleep_s,
                                         GATEWAY_DRAIN_S))
        elif role == "node-manager":
            stop_ms = int(arg_value(c["args"], "--stop-grace-ms") or 10000)
            if grace * 1000 < sleep_s * 1000 + stop_ms + 5000:
                problems.append("%s: terminationGracePeriodSeconds %d does "
                                "not cover --stop-grace-ms %d + 5 s" %
                                (ident(w, c), grace, stop_ms))
    return problems


def check_claims(bundle, _):
    """Every persistentVolumeClaim a pod mounts exists: a PVC here or the
    claim of a StatefulSet pod (<template>-<set>-<ordinal>); a pod mounting
    another workload's ReadWriteOnce claim has a required podAffinity to
    that workload's pods (the volume attaches to one node)."""
    problems = []
    pvcs = {p["metadata"]["name"] for p in find(bundle,
                                                "PersistentVolumeClaim")}
    owners = {}
    for sts in find(bundle, "StatefulSet"):
        for t in sts["spec"].get("volumeClaimTemplates", []):
            for i in range(sts["spec"].get("replicas", 1)):
                owners["%s-%s-%d" % (t["metadata"]["name"],
                                     sts["metadata"]["name"], i)] = sts
    for w, t in pod_templates(bundle):
        spec = t["spec"]
        for v in spec.get("volumes", []):
            claim = v.get("persistentVolumeClaim", {}).get("claimName")
            if claim is None:
                continue
            if claim not in pvcs and claim not in owners:
                problems.append("%s/%s: volume %s claims %r, which is neither "
                                "a PersistentVolumeClaim here nor a "
                                "StatefulSet pod's claim" %
                                (w["kind"], w["metadata"]["name"], v["name"],
                                 claim))
                continue
            owner = owners.get(claim)
            if owner is None:
                continue
            labels = owner["spec"]["template"]["metadata"]["labels"]
            terms = spec.get("affinity", {}).get("podAffinity", {}).get(
                "requiredDuringSchedulingIgnoredDuringExecution", [])
            if not any(labels_match(term.get("labelSelector", {}).get(
                    "matchLabels", {}), labels) and
                    term.get("topologyKey") == "kubernetes.io/hostname"
                    for term in terms):
                problems.append("%s/%s: mounts %s's claim %s without a "
                                "required podAffinity to its pods on "
                                "kubernetes.io/hostname" %
                                (w["kind"], w["metadata"]["name"],
                                 owner["metadata"]["name"], claim))
    return problems


def check_backup(bundle, ctx):
    """Runs each CronJob's script (its command with this venv's Python) on
    the running gateway's state directory while the gateway writes: the
    copy must hold a row written just before, and pass integrity_check."""
    problems = []
    gateways = [(w, c, env) for _, p, w, c, env in ctx.running.procs
                if role_of(c) == "gateway"]
    for w, spec, c in containers(bundle):
        if w["kind"] != "CronJob":
            continue
        cmd = c.get("command", [])
        if len(cmd) < 3 or not cmd[0].endswith("python3") or cmd[1] != "-c":
            problems.append("%s: command is not `python3 -c SCRIPT`" %
                            ident(w, c))
            continue
        if not gateways:
            problems.append("no gateway running to back up")
            continue
        gw, gc, genv = gateways[0]
        api = ctx.running.port_of[(gw["metadata"]["name"],
                                   int(arg_value(gc["args"], "--api-port")))]
        token = genv.get((gateway_config_of(ctx.bundle, gc) or {}).get(
            "api_token_env"))
        service_id = "backup-probe-%d" % time.monotonic_ns()
        req = urllib.request.Request(
            "http://127.0.0.1:%d/v1/services/register" % api,
            data=json.dumps({"service_id": service_id,
                             "service_type": "backup-test",
                             "base_url": "http://x:1"}).encode(),
            headers={"Authorization": "Bearer " + token,
                     "Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=10).read()
        except OSError as e:
            problems.append("registering a service before the backup: %s" % e)
            continue
        mounts = {}
        out_dir = tempfile.mkdtemp(dir=ctx.work)
        for m in c.get("volumeMounts", []):
            vol = [v for v in spec["volumes"] if v["name"] == m["name"]][0]
            claim = vol.get("persistentVolumeClaim", {}).get("claimName")
            if claim in ctx.running.claim_dirs:
                mounts[m["mountPath"]] = ctx.running.claim_dirs[claim]
            else:
                mounts[m["mountPath"]] = os.path.join(out_dir, m["name"])
                os.makedirs(mounts[m["mountPath"]], exist_ok=True)
        # One pass: a mapped path must not be mapped again.
        pattern = re.compile('"(%s)(?=[/"])' % "|".join(
            re.escape(mp) for mp in sorted(mounts, key=len, reverse=True)))
        script = pattern.sub(lambda m: '"' + mounts[m.group(1)], cmd[2])
        out = subprocess.run([sys.executable, "-c", script],
                             capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            problems.append("%s: the backup script failed (exit %d): %s" %
                            (ident(w, c), out.returncode,
                             (out.stderr or out.stdout).strip()[-500:]))
            continue
        copies = [os.path.join(d, f) for d in mounts.values()
                  if d.startswith(out_dir) for f in os.listdir(d)
                  if f.startswith("pcp-") and f.endswith(".db")]
        if len(copies) != 1:
            problems.append("%s: the backup wrote %s, want one pcp-*.db" %
                            (ident(w, c), copies))
            continue
        import sqlite3
        db = sqlite3.connect(copies[0])
        rows = db.execute("SELECT count(*) FROM services WHERE service_id = ?",
                          (service_id,)).fetchone()[0]
        ok = db.execute("PRAGMA integrity_check").fetchone()[0]
        db.close()
        print("backup: %s, %d bytes, probe row %s, integrity %s" %
              (os.path.basename(copies[0]), os.path.getsize(copies[0]),
               "present" if rows else "MISSING", ok))
        if rows != 1 or ok != "ok":
            problems.append("%s: the copy lacks the row written before it "
                            "(%d) or fails integrity_check (%s)" %
                            (ident(w, c), rows, ok))
    return problems


class Running:
    """The real processes started from the (unmutated) manifests."""

    def __init__(self):
        self.procs = []  # (ident, Popen)
        self.port_of = {}  # (workload name, container port) -> local port
        self.claim_dirs = {}  # PVC name of a StatefulSet pod -> host dir


def start_all(bundle, ctx):
    """Starts every gateway, then every node manager and hub container of
    ctx.roles from the manifests; returns Running (problems as failures)."""
    run = Running()
    sandbox = Sandbox(bundle, os.path.join(ctx.work, "run"))
    ordered = sorted(containers(bundle),
                     key=lambda x: role_of(x[2]) != "gateway")
    for w, spec, c in ordered:
        role = role_of(c)
        if role not in ctx.roles:
            continue
        args, env = sandbox.prepare(w, spec, c, "0")
        config = arg_value(args, "--gateway-config")
        if config:
            mounts = {m["mountPath"]: os.path.join(
                os.path.dirname(os.path.dirname(config)), m["name"])
                for m in c.get("volumeMounts", [])}
            map_config_paths(config, mounts)
            # The fabric Services of this gateway, for the node managers.
            with open(config) as f:
                local_fabric = json.load(f)["worker_fabric"]["port"]
            for svc in find(bundle, "Service"):
                if not labels_match(svc["spec"].get("selector", {}),
                                    w["spec"]["template"]["metadata"]
                                    ["labels"]):
                    continue
                fp = (gateway_config_of(bundle, c) or {}).get(
                    "worker_fabric", {}).get("port")
                for p in svc["spec"]["ports"]:
                    if resolve_port(c, p.get("targetPort")) == fp:
                        ns = svc["metadata"]["namespace"]
                        for dns in (svc["metadata"]["name"],
                                    "%s.%s" % (svc["metadata"]["name"], ns),
                                    "%s.%s.svc" % (svc["metadata"]["name"],
                                                   ns),
                                    "%s.%s.svc.cluster.local" % (
                                        svc["metadata"]["name"], ns)):
                            sandbox.fabric_ports["%s:%s" % (dns, p["port"])] \
                                = local_fabric
        full = dict(os.environ)
        for k in list(full):
            if k.startswith("PCP_") and k not in ("PCP_VENV",):
                del full[k]
        full.update(env)
        log = open(os.path.join(ctx.work, "%s.log" % w["metadata"]["name"]),
                   "w")
        p = subprocess.Popen([ctx.pcp.binary] + args, env=full, stdout=log,
                             stderr=subprocess.STDOUT)
        run.procs.append((ident(w, c), p, w, c, env))
        base = os.path.join(sandbox.root, "%s-0" % w["metadata"]["name"])
        for t in w["spec"].get("volumeClaimTemplates", []):
            run.claim_dirs["%s-%s-0" % (t["metadata"]["name"],
                                        w["metadata"]["name"])] = \
                os.path.join(base, t["metadata"]["name"])
        for name, cp in container_ports(c).items():
            run.port_of[(w["metadata"]["name"], cp)] = sandbox.ports.get(
                ((w["metadata"]["name"], "0"), cp))
        # Every role serves /healthz on --api-port; wait for it (or the
        # process's exit) so that the node managers find a listening
        # fabric and the probe checks a started server.
        api = arg_value(args, "--api-port")
        if api is not None and not wait_for(
                lambda: p.poll() is not None or
                http_get(int(api), "/healthz")[0] == 200, 60):
            print("%s did not answer /healthz within 60 s" % ident(w, c),
                  file=sys.stderr)
        if p.poll() is not None:
            print("%s exited %s at start; its log:\n%s" %
                  (ident(w, c), p.returncode, open(log.name).read()[-3000:]),
                  file=sys.stderr)
    return run


def check_probes(bundle, ctx):
    problems = []
    for w, spec, c in containers(bundle):
        role = role_of(c)
        if role not in ctx.roles:
            continue
        for kind in ("livenessProbe", "readinessProbe"):
            if kind not in c:
                problems.append("%s: no %s" % (ident(w, c), kind))
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe = c.get(kind)
            if not probe:
                continue
            get = probe.get("httpGet")
            if not get:
                problems.append("%s: %s is not an httpGet probe" %
                                (ident(w, c), kind))
                continue
            cport = resolve_port(c, get["port"])
            api = arg_value(c["args"], "--api-port")
            if cport is None or api is None or int(api) != cport:
                problems.append("%s: %s port %r is not the --api-port (%s) "
                                "the role serves its probes on" %
                                (ident(w, c), kind, get["port"], api))
                continue
            local = ctx.running.port_of.get((w["metadata"]["name"], cport))
            status, body = http_get(local, get["path"]) if local else (None,
                                                                       b"")
            want = {"livenessProbe": (200,), "startupProbe": (200,)}.get(
                kind, (200, 503))
            try:
                json_body = isinstance(json.loads(body), dict)
            except ValueError:
                json_body = False
            if status not in want or not json_body:
                problems.append("%s: %s GET %s on the real %s answered %s "
                                "(want %s with a JSON object)" %
                                (ident(w, c), kind, get["path"], role, status,
                                 "/".join(map(str, want))))
    return problems


def check_joined(bundle, ctx):
    """The CPU node manager's worker joined the gateway with the manifests'
    join token, under the downward-API id; the API wants the API token."""
    problems = []
    gw = [(w, c, env) for _, p, w, c, env in ctx.running.procs
          if role_of(c) == "gateway"]
    nms = [(w, c) for _, p, w, c, env in ctx.running.procs
           if role_of(c) == "node-manager" and
           arg_value(c["args"], "--backend") == "cpu"]
    if not gw or not nms:
        return ["no gateway and CPU node manager were started"]
    w, c, env = gw[0]
    port = ctx.running.port_of[(w["metadata"]["name"],
                                int(arg_value(c["args"], "--api-port")))]
    token_env = (gateway_config_of(ctx.bundle, c) or {}).get("api_token_env")
    token = env.get(token_env)
    status, _ = http_get(port, "/v1/workers")
    if status != 401:
        problems.append("GET /v1/workers without the token: %s, not 401 "
                        "(the API token is not wired)" % status)

    def joined():
        s, body = http_get(port, "/v1/workers", token)
        if s != 200:
            return False
        return [x["worker_id"] for x in json.loads(body)["workers"]
                if x["state"] == "connected"]

    ids = wait_for(joined, 60) and joined()
    print("joined the gateway: %s" % ids)
    if not ids:
        problems.append("no worker of the CPU node manager joined the "
                        "gateway within 60 s")
    elif not any("node-0" in i for i in ids):
        problems.append("worker ids %s do not carry the node name" % ids)
    return problems


#===----------------------------------------------------------------------===#
# Mutations: each must make its check fail
#===----------------------------------------------------------------------===#


def first(bundle, kind, name):
    return find(bundle, kind, name)[0]


def gw_container(b):
    return first(b, "StatefulSet", "pcp-gateway")["spec"]["template"][
        "spec"]["containers"][0]


def nm_container(b, variant="cpu"):
    return first(b, "DaemonSet", "pcp-node-manager-" + variant)["spec"][
        "template"]["spec"]["containers"][0]


def set_config(b, key, value):
    cm = first(b, "ConfigMap", "pcp-gateway-config")
    config = json.loads(cm["data"]["gateway.json"])
    config[key] = value
    cm["data"]["gateway.json"] = json.dumps(config)


def replace_arg(c, flag, value):
    c["args"][c["args"].index(flag) + 1] = value


def drop_env(c, name):
    c["env"] = [e for e in c["env"] if e["name"] != name]


NEGATIVE = [
    # (check, what, mutation, words the problem must contain)
    ("schema", "an unknown field",
     lambda b: gw_container(b)["securityContext"].update(
         {"readOnlyRootFilesytem": True}), "readOnlyRootFilesytem"),
    ("schema", "a misspelt apiVersion (no schema: the tool only warns)",
     lambda b: first(b, "DaemonSet", "pcp-node-manager-cpu").update(
         {"apiVersion": "apps/v2"}), "warned"),
    ("kustomization", "a manifest left out",
     lambda b: b["kustomization.yaml"][0]["resources"].remove("hub.yaml"),
     "hub.yaml"),
    ("selectors", "a pod label that the selector misses",
     lambda b: first(b, "DaemonSet", "pcp-node-manager-gpu")["spec"][
         "template"]["metadata"]["labels"].update(
             {"app.kubernetes.io/component": "gpu"}), "selector"),
    ("selectors", "a PDB selecting nothing",
     lambda b: first(b, "PodDisruptionBudget", "pcp-gateway")["spec"][
         "selector"]["matchLabels"].update(
             {"app.kubernetes.io/component": "gw"}), "matches no pod"),
    ("services", "a targetPort no container declares",
     lambda b: first(b, "Service", "pcp-gateway")["spec"]["ports"][0].update(
         {"targetPort": "http"}), "targets 'http'"),
    ("services", "a Service selecting no pod",
     lambda b: first(b, "Service", "pcp-hub")["spec"]["selector"].update(
         {"app.kubernetes.io/component": "federation-hub"}),
     "matches no pod"),
    ("images", "another tag",
     lambda b: nm_container(b).update({"image": "localhost/pcp:0.0.9"}),
     "localhost/pcp:0.0.9"),
    ("images", "a pull policy that needs a registry",
     lambda b: gw_container(b).update({"imagePullPolicy": "IfNotPresent"}),
     "imagePullPolicy"),
    ("args", "a misspelt flag",
     lambda b: nm_container(b)["args"].extend(["--stop-grace", "5000"]),
     "--stop-grace"),
    ("args", "a value the flag refuses",
     lambda b: replace_arg(nm_container(b, "gpu"), "--backend", "nvidia"),
     "nvidia"),
    ("env", "the gateway's join token variable missing",
     lambda b: drop_env(gw_container(b), "PCP_WORKER_JOIN_TOKEN"),
     "PCP_WORKER_JOIN_TOKEN"),
    ("env", "the config naming a variable the pod does not set",
     lambda b: set_config(b, "api_token_env", "PCP_GATEWAY_TOKEN"),
     "PCP_GATEWAY_TOKEN"),
    ("env", "the node manager without the workers' join token",
     lambda b: drop_env(nm_container(b), "PCP_WORKER_JOIN_TOKEN"),
     "join-token-env"),
    ("env", "a Secret key the example does not define",
     lambda b: gw_container(b)["env"][0]["valueFrom"]["secretKeyRef"].update(
         {"key": "token"}), "'token'"),
    ("config_paths", "--gateway-config outside the ConfigMap",
     lambda b: replace_arg(gw_container(b), "--gateway-config",
                           "/etc/pcp/gw.json"), "/etc/pcp/gw.json"),
    ("config_paths", "a model root on no volume",
     lambda b: set_config(b, "model_roots", ["/var/lib/pcp/models",
                                             "/models"]), "/models"),
    ("config_paths", "state_dir off the claim",
     lambda b: set_config(b, "state_dir", "/tmp/state"),
     "volumeClaimTemplate"),
    ("security", "a writable root filesystem",
     lambda b: nm_container(b, "gpu")["securityContext"].update(
         {"readOnlyRootFilesystem": False}), "readOnlyRootFilesystem"),
    ("security", "/tmp not mounted on a read-only root",
     lambda b: gw_container(b).update({"volumeMounts": [
         m for m in gw_container(b)["volumeMounts"]
         if m["mountPath"] != "/tmp"]}), "/tmp"),
    ("security", "root",
     lambda b: first(b, "Deployment", "pcp-hub")["spec"]["template"]["spec"][
         "securityContext"].update({"runAsUser": 0}), "runAsUser"),
    ("security", "no seccomp profile",
     lambda b: first(b, "CronJob", "pcp-gateway-backup")["spec"][
         "jobTemplate"]["spec"]["template"]["spec"]["securityContext"].pop(
             "seccompProfile"), "seccompProfile"),
    ("security", "Service links on",
     lambda b: first(b, "DaemonSet", "pcp-node-manager-cpu")["spec"][
         "template"]["spec"].pop("enableServiceLinks"), "enableServiceLinks"),
    ("memory", "no job memory cap (half the node's memory)",
     lambda b: set_config(b, "max_job_gateway_bytes", 0),
     "max_job_gateway_bytes"),
    ("fabric", "a fabric Service that hides not-ready gateways",
     lambda b: first(b, "Service", "pcp-gateway-fabric")["spec"].pop(
         "publishNotReadyAddresses"), "not-ready"),
    ("fabric", "node managers pointed at the API Service",
     lambda b: replace_arg(nm_container(b), "--host",
                           "pcp-gateway.pcp.svc.cluster.local"),
     "has no port 8080"),
    ("gpu", "more workers than GPUs",
     lambda b: replace_arg(nm_container(b, "gpu"), "--scale", "2"),
     "one worker per GPU"),
    ("gpu", "no toleration",
     lambda b: first(b, "DaemonSet", "pcp-node-manager-gpu")["spec"][
         "template"]["spec"].pop("tolerations"), "toleration"),
    ("worker_ids", "NODE_NAME not set",
     lambda b: drop_env(nm_container(b), "NODE_NAME"), "one per node"),
    ("drain", "a grace period shorter than the drain",
     lambda b: first(b, "StatefulSet", "pcp-gateway")["spec"]["template"][
         "spec"].update({"terminationGracePeriodSeconds": 15}),
     "terminationGracePeriodSeconds 15"),
    ("drain", "no preStop",
     lambda b: gw_container(b).pop("lifecycle"), "preStop"),
    ("claims", "a claim that does not exist",
     lambda b: first(b, "CronJob", "pcp-gateway-backup")["spec"][
         "jobTemplate"]["spec"]["template"]["spec"]["volumes"][0][
         "persistentVolumeClaim"].update({"claimName": "state-pcp-gateway"}),
     "'state-pcp-gateway'"),
    ("claims", "the gateway's claim mounted on any node",
     lambda b: first(b, "CronJob", "pcp-gateway-backup")["spec"][
         "jobTemplate"]["spec"]["template"]["spec"].pop("affinity"),
     "podAffinity"),
    ("backup", "the script reading another file",
     lambda b: first(b, "CronJob", "pcp-gateway-backup")["spec"][
         "jobTemplate"]["spec"]["template"]["spec"]["containers"][0][
         "command"].__setitem__(2, first(b, "CronJob", "pcp-gateway-backup")[
             "spec"]["jobTemplate"]["spec"]["template"]["spec"][
             "containers"][0]["command"][2].replace("pcp.db", "state.db")),
     "backup script failed"),
    ("probes", "a readiness path the gateway does not serve",
     lambda b: gw_container(b)["readinessProbe"]["httpGet"].update(
         {"path": "/ready"}), "/ready "),
    ("probes", "a probe on the fabric port",
     lambda b: gw_container(b)["livenessProbe"]["httpGet"].update(
         {"port": "fabric"}), "--api-port"),
    ("probes", "the node manager's liveness path misspelt",
     lambda b: nm_container(b, "gpu")["livenessProbe"]["httpGet"].update(
         {"path": "/health"}), "/health "),
]

def hub_container(b):
    return first(b, "Deployment", "pcp-hub")["spec"]["template"]["spec"][
        "containers"][0]


def drop_arg(c, flag):
    i = c["args"].index(flag)
    del c["args"][i:i + 2]


# The same for the hub's container (deploy_k8s_hub).
HUB_NEGATIVE = [
    ("args", "no --state-dir (required)",
     lambda b: drop_arg(hub_container(b), "--state-dir"), "--state-dir"),
    ("env", "the federation token variable missing",
     lambda b: drop_env(hub_container(b), "PCP_FEDERATION_TOKEN"),
     "PCP_FEDERATION_TOKEN"),
    ("probes", "a readiness path the hub does not serve",
     lambda b: hub_container(b)["readinessProbe"]["httpGet"].update(
         {"path": "/ready"}), "/ready "),
]

CHECKS = {
    "schema": check_schema, "kustomization": check_kustomization,
    "selectors": check_selectors, "services": check_services,
    "images": check_images, "args": check_args, "env": check_env,
    "config_paths": check_config_paths, "security": check_security,
    "memory": check_memory, "fabric": check_fabric, "gpu": check_gpu,
    "worker_ids": check_worker_ids, "drain": check_drain,
    "probes": check_probes, "claims": check_claims, "backup": check_backup,
}
# Checks that run the binary on a role's containers, and the roles whose
# mutations above they need.
ROLE_CHECKS = {"args", "env", "worker_ids", "probes"}


def write_bundle(bundle, directory):
    os.makedirs(directory, exist_ok=True)
    for name, docs in bundle.items():
        with open(os.path.join(directory, name), "w") as f:
            yaml.safe_dump_all(docs, f, sort_keys=False)


class Context:
    pass


def main():
    argv = sys.argv[1:]
    binary = argv[0] if argv and not argv[0].startswith("--") else \
        os.environ.get("PCP_BINARY")
    roles = {"gateway", "node-manager"}
    if "--roles" in argv:
        roles = set(argv[argv.index("--roles") + 1].split(","))
    hub_only = roles == {"federation-hub"}
    ctx = Context()
    ctx.pcp = Pcp(binary)
    ctx.roles = roles
    ctx.work = tempfile.mkdtemp(prefix="pcp-k8s-test-")
    bundle = load(MANIFESTS)
    ctx.bundle = bundle  # what the processes were started from
    check(bundle, "no manifests under %s" % MANIFESTS)
    ctx.running = None
    try:
        ctx.running = start_all(bundle, ctx)
        for name, fn in CHECKS.items():
            if hub_only and name not in ROLE_CHECKS:
                continue
            directory = MANIFESTS
            problems = fn(bundle, directory if name == "schema" else ctx)
            print("check %-14s %s" % (name, "ok" if not problems else
                                      "%d problem(s)" % len(problems)))
            for p in problems:
                check(False, "%s: %s" % (name, p))
        if not hub_only:
            for p in check_joined(bundle, ctx):
                check(False, "joined: " + p)
        # Negative tests.
        negatives = HUB_NEGATIVE if hub_only else NEGATIVE
        for index, (name, what, mutate, words) in enumerate(negatives):
            mutated = copy.deepcopy(bundle)
            mutate(mutated)
            if name == "schema":
                directory = os.path.join(ctx.work, "mutated-%d" % index)
                write_bundle(mutated, directory)
                problems = check_schema(mutated, directory)
            else:
                problems = CHECKS[name](mutated, ctx)
            seen = any(words in p for p in problems)
            check(seen, "negative test: %s (%s) was not caught by '%s' "
                  "(problems: %s)" % (name, what, name, problems))
            print("negative %-14s %-55s %s" % (name, what,
                                               "caught" if seen else "MISSED"))
        if not hub_only:
            check_sigterm(bundle, ctx)
    finally:
        for _, p, *_ in (ctx.running.procs if ctx.running else []):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for _, p, *_ in (ctx.running.procs if ctx.running else []):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if not FAILURES:
            shutil.rmtree(ctx.work, ignore_errors=True)
        else:
            print("logs and mutated manifests kept in", ctx.work,
                  file=sys.stderr)
    if FAILURES:
        print("%d failure(s)" % len(FAILURES), file=sys.stderr)
        return 1
    print("k8s manifests: all checks passed, %d negative tests caught" %
          len(HUB_NEGATIVE if hub_only else NEGATIVE))
    return 0


def check_sigterm(bundle, ctx):
    """SIGTERM to the gateway (after what would be its preStop): it drains
    and exits 0 within its grace period less the preStop sleep."""
    for _, p, w, c, _ in ctx.running.procs:
        if role_of(c) != "gateway":
            continue
        grace = w["spec"]["template"]["spec"].get(
            "terminationGracePeriodSeconds", 30)
        sleep_s = c.get("lifecycle", {}).get("preStop", {}).get(
            "sleep", {}).get("seconds", 0)
        start = time.monotonic()
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=grace - sleep_s)
        except subprocess.TimeoutExpired:
            rc = None
        took = time.monotonic() - start
        check(rc == 0, "gateway after SIGTERM: exit %s after %.1f s, want 0 "
              "within %d s" % (rc, took, grace - sleep_s))
        print("gateway SIGTERM to exit: %.1f s (budget %d s)" %
              (took, grace - sleep_s))


if __name__ == "__main__":
    sys.exit(main())
