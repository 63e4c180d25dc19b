#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""An N-host cluster on one machine: network namespaces, veth pairs, a
bridge, and every host's link rate-limited with `tc qdisc ... tbf` in both
directions (issue 17 Deliver 5; docs/cluster.md).

Layout of a cluster with tag T and N hosts:

  pcp-T-hub   a namespace holding the bridge br0 and one port p<i> per host
  pcp-T-h<i>  host i: lo and eth0 (the other end of p<i>), address
              SUBNET.(i+1)/24; nothing else

Every interface is created inside a namespace of the run (never in the
machine's own namespace), so no interface name can collide between runs
and nothing of the cluster is routable from or to the outside: the hub has
no uplink and the machine's namespace holds no address of the subnet.

Shaping: tbf on the egress of eth0 (what host i sends: its uplink) and on
the egress of p<i> in the hub (what host i receives: its downlink). tbf
shapes only egress, hence one qdisc at each end of the pair; traffic from
host a to host b crosses a's uplink and b's downlink, as on a real access
network.

Use from Python:

    with Cluster(hosts=3, rates=[None, "100mbit", "100mbit"]) as c:
        gw = c.spawn(0, ["build/pcp", "--gateway", ...])
        with c.inside(0):           # this thread's sockets live in h0
            urllib.request.urlopen("http://%s:8000/healthz" % c.addr(0))

and from the shell (`cluster.py --help`): check, up, exec, down, run,
cleanup, list. Exit codes: 0 ok, 1 failure, 2 usage, 3 the host does not
allow network namespaces (EXIT_UNSUPPORTED; tests turn that into a failure
unless PCP_CLUSTER_OPTIONAL=1).

Python 3.11 standard library only.
"""
import argparse
import contextlib
import ctypes
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_UNSUPPORTED = 3
EXIT_TIMEOUT = 124

# Where each run records its owner (pid + start time) before it creates
# anything, so `cleanup --all-stale` can tell a dead run's leftovers from a
# live run's namespaces. /run is where iproute2 keeps /run/netns too: both go
# at a reboot.
STATE_DIR = os.environ.get("PCP_CLUSTER_STATE_DIR", "/run/pcp-cluster")
DEFAULT_SUBNET = "10.213.0.0/24"
MAX_HOSTS = 64
TAG_RE = re.compile(r"^[a-z0-9]{1,16}$")
NS_RE = re.compile(r"^pcp-([a-z0-9]{1,16})-(hub|h\d{1,2})$")
# tc's rate units (bit/s), the subset we accept.
RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9,
              "bps": 8, "kbps": 8 * 10**3, "mbps": 8 * 10**6}
MIN_RATE, MAX_RATE = 8 * 10**3, 100 * 10**9
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
# Held back while a cluster is torn down.
HELD_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


class Unsupported(Exception):
    """The host does not allow what the cluster needs (root/CAP_NET_ADMIN,
    ip, tc, network namespaces, veth, bridge, tbf). str() says which."""


class ClusterError(Exception):
    """A step of building or running the cluster failed."""


# ---------------------------------------------------------------- helpers


def _sh(argv, check=True, timeout=30):
    """Runs a command (no shell), returns CompletedProcess; raises
    ClusterError naming the command and its stderr when |check| fails."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True,
                           timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ClusterError("%s: %s" % (" ".join(argv), e)) from None
    if check and r.returncode != 0:
        raise ClusterError("%s: exit %d: %s" % (
            " ".join(argv), r.returncode, r.stderr.strip()))
    return r


def parse_rate(text):
    """'100mbit' | '1.5gbit' | 12500000 (bit/s) -> bit/s as int; ValueError
    naming the input otherwise. Bounds: 8 kbit/s .. 100 gbit/s."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        bits = int(text)
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)\s*",
                         str(text).lower())
        if not m or (m.group(2) or "bit") not in RATE_UNITS:
            raise ValueError("rate %r: want a number and one of %s" % (
                text, ", ".join(RATE_UNITS)))
        bits = int(float(m.group(1)) * RATE_UNITS[m.group(2) or "bit"])
    if not MIN_RATE <= bits <= MAX_RATE:
        raise ValueError("rate %r: outside 8kbit..100gbit" % (text,))
    return bits


def parse_ms(text, what):
    """'50ms' | '0.2s' | 50 (ms) -> ms as float, 0 < ms <= 10 s."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        ms = float(text)
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|us)?\s*",
                         str(text).lower())
        if not m:
            raise ValueError("%s %r: want e.g. 50ms" % (what, text))
        ms = float(m.group(1)) * {"ms": 1, None: 1, "s": 1000,
                                  "us": 0.001}[m.group(2)]
    if not 0 < ms <= 10000:
        raise ValueError("%s %r: outside (0, 10s]" % (what, text))
    return ms


def default_burst(rate_bits):
    """tbf bucket in bytes: 5 ms of the rate, at least 16 KiB (above one
    MTU frame with room for the kernel's timer slack; tbf splits GSO
    packets larger than the bucket), at most 16 MiB."""
    return max(16 * 1024, min(16 << 20, rate_bits // 8 // 200))


class Link:
    """One host's access link: rate (bit/s, None = unshaped), tbf burst
    (bytes) and latency (ms: how long a packet may wait in tbf's queue,
    which sets the queue's length)."""

    def __init__(self, rate=None, burst=None, latency="50ms"):
        if isinstance(rate, str) and rate.strip().lower() in ("none",
                                                              "unshaped"):
            rate = None
        self.rate = None if rate is None else parse_rate(rate)
        if burst is None:
            self.burst = default_burst(self.rate) if self.rate else None
        else:
            self.burst = int(burst)
            if not 1600 <= self.burst <= 64 << 20:
                raise ValueError("burst %r: outside 1600..64MiB bytes" %
                                 (burst,))
        self.latency_ms = parse_ms(latency, "latency")

    def tbf_args(self):
        return ["tbf", "rate", "%dbit" % self.rate, "burst",
                "%d" % self.burst, "latency", "%gms" % self.latency_ms]

    def describe(self):
        if not self.rate:
            return "unshaped"
        return "%g Mbit/s (burst %d B, latency %g ms)" % (
            self.rate / 1e6, self.burst, self.latency_ms)


def _proc_start_time(pid):
    """The kernel start time of |pid| (field 22 of /proc/PID/stat), None
    when it does not exist: with the pid it names one process for good."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _pdeathsig():
    """In the child before exec: SIGTERM when the thread that spawned it
    ends (a SIGKILLed test leaves no server running; cleanup gets the rest).
    """
    _libc().prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


# ---------------------------------------------------------- capabilities

_CAPS_OK = None


def _cap_eff():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def check_capabilities():
    """None when this host can build clusters, else a message that says what
    is missing. Probes for real (a namespace, a veth pair, a bridge, a tbf
    qdisc) and removes the probe; the answer is cached per process."""
    global _CAPS_OK
    if _CAPS_OK:
        return None
    caps = _cap_eff()
    # CAP_NET_ADMIN (12) for links and qdiscs, CAP_SYS_ADMIN (21) for the
    # namespaces' bind mounts and setns.
    missing = [n for bit, n in ((12, "CAP_NET_ADMIN"), (21, "CAP_SYS_ADMIN"))
               if not caps & (1 << bit)]
    if missing:
        return ("network namespaces need root (CAP_NET_ADMIN and "
                "CAP_SYS_ADMIN); this process (uid %d) lacks %s" %
                (os.geteuid(), " and ".join(missing)))
    for tool, pkg in (("ip", "iproute2"), ("tc", "iproute2")):
        if not shutil.which(tool):
            return "'%s' is not on PATH (install Debian's %s)" % (tool, pkg)
    # A probe namespace of its own tag, recorded like a run's, so that a
    # concurrent `cleanup --all-stale` leaves it alone while we live and
    # removes it if we die mid-probe.
    probe_tag = "probe%d" % os.getpid()
    probe = "pcp-%s-h0" % probe_tag
    try:
        _write_record(probe_tag, {
            "tag": probe_tag, "owner_pid": os.getpid(),
            "owner_start": _proc_start_time(os.getpid()), "detached": False,
            "created": time.time()})
    except OSError as e:
        return "cannot write the run records in %s: %s" % (STATE_DIR, e)
    steps = [
        (["ip", "netns", "add", probe], "creating a network namespace"),
        (["ip", "-n", probe, "link", "add", "a0", "type", "veth", "peer",
          "name", "a1"], "creating a veth pair (kernel module veth)"),
        (["ip", "-n", probe, "link", "add", "b0", "type", "bridge"],
         "creating a bridge (kernel module bridge)"),
        (["tc", "-n", probe, "qdisc", "add", "dev", "a0", "root", "tbf",
          "rate", "1mbit", "burst", "16384", "latency", "50ms"],
         "adding a tbf qdisc (kernel module sch_tbf)"),
    ]
    try:
        for argv, what in steps:
            try:
                r = _sh(argv, check=False)
            except ClusterError as e:
                return "%s failed: %s" % (what, e)
            if r.returncode != 0:
                return "%s failed: %s: %s" % (what, " ".join(argv),
                                              r.stderr.strip())
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
        _remove_record(probe_tag)
    _CAPS_OK = True
    return None


def require_or_exit(test_name):
    """For tests: returns when clusters can be built; otherwise prints why
    and exits 1 (a failure), or EXIT_UNSUPPORTED when the caller opted out
    with PCP_CLUSTER_OPTIONAL=1 (ctest's SKIP_RETURN_CODE shows it as
    skipped, never as passed)."""
    why = check_capabilities()
    if why is None:
        return
    if os.environ.get("PCP_CLUSTER_OPTIONAL") == "1":
        print("%s: NOT RUN (PCP_CLUSTER_OPTIONAL=1): %s" % (test_name, why))
        sys.exit(EXIT_UNSUPPORTED)
    print("%s: FAIL: this host cannot build a network-namespace cluster: "
          "%s (set PCP_CLUSTER_OPTIONAL=1 to report it as not run)" %
          (test_name, why), file=sys.stderr)
    sys.exit(EXIT_FAILURE)


# ------------------------------------------------------------- records


def _record_path(tag):
    return os.path.join(STATE_DIR, tag + ".json")


def _write_record(tag, record):
    os.makedirs(STATE_DIR, mode=0o700, exist_ok=True)
    tmp = _record_path(tag) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, _record_path(tag))


def _read_record(tag):
    try:
        with open(_record_path(tag)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _remove_record(tag):
    with contextlib.suppress(OSError):
        os.unlink(_record_path(tag))


def list_namespaces():
    """{tag: [namespace, ...]} of every cluster namespace on the machine."""
    r = _sh(["ip", "netns", "list"], check=False)
    out = {}
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = NS_RE.match(name)
        if m:
            out.setdefault(m.group(1), []).append(name)
    if os.path.isdir(STATE_DIR):
        for name in os.listdir(STATE_DIR):
            if name.endswith(".json") and TAG_RE.match(name[:-5]):
                out.setdefault(name[:-5], [])
    return out


def is_stale(tag):
    """True when the run that owns |tag| is gone: no record, or its owner
    process no longer exists (pid and start time). Clusters made by `up`
    (detached) are never stale: `down`/`cleanup --tag` remove them."""
    rec = _read_record(tag)
    if rec is None:
        return True
    if rec.get("detached"):
        return False
    pid = rec.get("owner_pid")
    return not (isinstance(pid, int) and
                _proc_start_time(pid) == rec.get("owner_start"))


def _kill_namespace_pids(ns, sig=signal.SIGKILL):
    r = _sh(["ip", "netns", "pids", ns], check=False)
    killed = 0
    for word in r.stdout.split():
        pid = int(word)
        if pid == os.getpid():
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
            killed += 1
    return killed


def remove_tag(tag, namespaces=None, grace_s=3.0):
    """Ends every process in the tag's namespaces (SIGTERM, then SIGKILL
    after |grace_s|), deletes the namespaces (which removes their veths and
    the bridge) and the record. Returns the namespaces it deleted."""
    if namespaces is None:
        namespaces = list_namespaces().get(tag, [])
    hosts = [n for n in namespaces if not n.endswith("-hub")]
    for ns in hosts:
        _kill_namespace_pids(ns, signal.SIGTERM)
    deadline = time.time() + grace_s
    while time.time() < deadline and any(
            _sh(["ip", "netns", "pids", ns], check=False).stdout.strip()
            for ns in namespaces):
        time.sleep(0.05)
    for ns in namespaces:
        _kill_namespace_pids(ns, signal.SIGKILL)
    deleted = []
    for ns in namespaces:
        r = _sh(["ip", "netns", "del", ns], check=False)
        if r.returncode == 0:
            deleted.append(ns)
    _remove_record(tag)
    return deleted


def cleanup_stale(log=None):
    """Removes every stale tag (see is_stale); returns {tag: [ns, ...]}."""
    removed = {}
    for tag, namespaces in list_namespaces().items():
        if is_stale(tag):
            removed[tag] = remove_tag(tag, namespaces)
            if log:
                log("removed stale cluster %s: %s" % (
                    tag, " ".join(removed[tag]) or "(record only)"))
    return removed


# -------------------------------------------------------------- cluster


class Cluster:
    """N hosts in network namespaces behind one bridge. |rates| is one rate
    for every host or a list (None = unshaped); |links| (a list of Link)
    overrides it. A context manager: up() on enter, down() on exit, on
    errors and on SIGINT/SIGTERM (in the main thread)."""

    def __init__(self, hosts=2, rates=None, burst=None, latency="50ms",
                 links=None, subnet=DEFAULT_SUBNET, tag=None, detached=False,
                 log=None):
        if not isinstance(hosts, int) or not 1 <= hosts <= MAX_HOSTS:
            raise ValueError("hosts %r: want 1..%d" % (hosts, MAX_HOSTS))
        if links is None:
            if rates is None or isinstance(rates, (str, int, float)):
                rates = [rates] * hosts
            if len(rates) != hosts:
                raise ValueError("rates: %d given for %d hosts" % (
                    len(rates), hosts))
            links = [Link(r, burst, latency) for r in rates]
        if len(links) != hosts:
            raise ValueError("links: %d given for %d hosts" % (
                len(links), hosts))
        net = ipaddress.ip_network(subnet, strict=True)
        if net.version != 4 or net.prefixlen != 24 or not net.is_private:
            raise ValueError("subnet %r: want a private IPv4 /24" % subnet)
        if tag is not None and not TAG_RE.match(tag):
            raise ValueError("tag %r: want 1-16 of [a-z0-9]" % tag)
        self.hosts, self.links, self.net = hosts, links, net
        self.tag = tag or "c" + os.urandom(4).hex()
        self.detached = detached
        self.log = log or (lambda msg: None)
        self.procs = []
        self._is_up = False
        self._lock = threading.Lock()
        self._old_handlers = {}

    # names and addresses
    def ns(self, i):
        self._check_host(i)
        return "pcp-%s-h%d" % (self.tag, i)

    @property
    def hub(self):
        return "pcp-%s-hub" % self.tag

    def namespaces(self):
        return [self.hub] + [self.ns(i) for i in range(self.hosts)]

    def addr(self, i):
        self._check_host(i)
        return str(self.net.network_address + i + 1)

    def _check_host(self, i):
        if not isinstance(i, int) or not 0 <= i < self.hosts:
            raise ValueError("host %r: want 0..%d" % (i, self.hosts - 1))

    def describe(self):
        return {"tag": self.tag, "subnet": str(self.net), "hub": self.hub,
                "hosts": [{"host": i, "namespace": self.ns(i),
                           "address": self.addr(i),
                           "link": self.links[i].describe()}
                          for i in range(self.hosts)]}

    # build and tear down
    def up(self):
        why = check_capabilities()
        if why:
            raise Unsupported(why)
        existing = list_namespaces()
        if self.tag in existing:
            raise ClusterError("tag %s is in use (%s); `cleanup --tag %s` "
                               "removes it" % (self.tag, " ".join(
                                   existing[self.tag]) or "record", self.tag))
        # The record first: a run killed from here on is found as stale.
        rec = {"tag": self.tag, "owner_pid": os.getpid(),
               "owner_start": _proc_start_time(os.getpid()),
               "detached": self.detached, "created": time.time(),
               "cluster": self.describe()}
        _write_record(self.tag, rec)
        self._is_up = True
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        self.log("cluster %s up: %s" % (self.tag, ", ".join(
            "h%d %s %s" % (i, self.addr(i), self.links[i].describe())
            for i in range(self.hosts))))
        return self

    def _build(self):
        hub = self.hub
        _sh(["ip", "netns", "add", hub])
        _sh(["ip", "-n", hub, "link", "add", "br0", "type", "bridge"])
        _sh(["ip", "-n", hub, "link", "set", "br0", "up"])
        for i in range(self.hosts):
            ns, port = self.ns(i), "p%d" % i
            _sh(["ip", "netns", "add", ns])
            # Both ends are created inside the run's namespaces: nothing
            # appears in the machine's namespace, names cannot collide.
            _sh(["ip", "link", "add", "eth0", "netns", ns, "type", "veth",
                 "peer", "name", port, "netns", hub])
            _sh(["ip", "-n", hub, "link", "set", port, "master", "br0"])
            _sh(["ip", "-n", hub, "link", "set", port, "up"])
            _sh(["ip", "-n", ns, "link", "set", "lo", "up"])
            _sh(["ip", "-n", ns, "addr", "add",
                 "%s/%d" % (self.addr(i), self.net.prefixlen), "dev", "eth0"])
            _sh(["ip", "-n", ns, "link", "set", "eth0", "up"])
            link = self.links[i]
            if link.rate:
                # Uplink: what host i sends; downlink: what it receives
                # (egress of its bridge port).
                _sh(["tc", "-n", ns, "qdisc", "replace", "dev", "eth0",
                     "root"] + link.tbf_args())
                _sh(["tc", "-n", hub, "qdisc", "replace", "dev", port,
                     "root"] + link.tbf_args())

    def down(self, grace_s=10.0):
        """Idempotent: SIGTERM to every spawned process group, SIGKILL after
        |grace_s|, then remove_tag (anything else left in the namespaces,
        the namespaces, the record). SIGINT/SIGTERM/SIGHUP are held back
        while it runs (a second Ctrl-C must not cut the teardown short) and
        delivered after it."""
        with self._lock:
            if not self._is_up:
                return
            self._is_up = False
        old = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
        try:
            self._teardown(grace_s)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def _teardown(self, grace_s):
        live = [p for p in self.procs if p.poll() is None]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.time() + grace_s
        for p in live:
            try:
                p.wait(max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)
        remove_tag(self.tag, [n for n in self.namespaces()
                              if os.path.exists("/run/netns/" + n)],
                   grace_s=2.0)
        self.log("cluster %s down" % self.tag)

    def _on_signal(self, signum, frame):
        raise KeyboardInterrupt("signal %d" % signum)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGHUP):
                self._old_handlers[s] = signal.signal(s, self._on_signal)
        try:
            return self.up()
        except BaseException:
            self._restore_handlers()
            raise

    def __exit__(self, *exc):
        # The caller's handlers come back before the teardown, with the
        # signals held: one that arrives meanwhile reaches them after it.
        old = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
        try:
            self._restore_handlers()
            self.down()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return False

    def _restore_handlers(self):
        for s, h in self._old_handlers.items():
            signal.signal(s, h)
        self._old_handlers = {}

    # processes
    def command(self, i, argv):
        """|argv| wrapped to run in host i's namespace."""
        return ["ip", "netns", "exec", self.ns(i)] + list(argv)

    def host_env(self, i, env=None):
        """|env| (default: this process's) plus PCP_CLUSTER_TAG,
        PCP_CLUSTER_HOST, PCP_CLUSTER_ADDR and NODE_NAME=<namespace>: the
        hosts share the machine's hostname, and a worker's id is made from
        NODE_NAME (docs/cluster.md), so two hosts' workers would collide.
        A NODE_NAME in an explicit |env| wins."""
        out = dict(os.environ if env is None else env)
        out.update(PCP_CLUSTER_TAG=self.tag, PCP_CLUSTER_HOST=str(i),
                   PCP_CLUSTER_ADDR=self.addr(i))
        if env is None or "NODE_NAME" not in env:
            out["NODE_NAME"] = self.ns(i)
        return out

    def spawn(self, i, argv, **popen_kw):
        """Starts |argv| in host i (own process group; SIGTERM when the
        spawning thread dies; environment from host_env); down() ends it.
        Popen keywords pass through.
        """
        if not self._is_up:
            raise ClusterError("cluster %s is not up" % self.tag)
        popen_kw["env"] = self.host_env(i, popen_kw.get("env"))
        popen_kw.setdefault("start_new_session", True)
        popen_kw.setdefault("preexec_fn", _pdeathsig)
        p = subprocess.Popen(self.command(i, argv), **popen_kw)
        self.procs.append(p)
        return p

    def run(self, i, argv, **run_kw):
        """subprocess.run of |argv| in host i (bounded by run_kw's timeout,
        default 60 s)."""
        run_kw.setdefault("timeout", 60)
        run_kw["env"] = self.host_env(i, run_kw.get("env"))
        return subprocess.run(self.command(i, argv), **run_kw)

    @contextlib.contextmanager
    def inside(self, i):
        """Moves the calling thread into host i's network namespace for the
        block: sockets it opens there talk on the cluster's network (the API
        of a server that listens only on a private address)."""
        libc = _libc()
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open("/run/netns/" + self.ns(i), os.O_RDONLY)
        try:
            if libc.setns(target, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise ClusterError("setns into %s: %s" % (
                    self.ns(i), os.strerror(err)))
            try:
                yield self
            finally:
                if libc.setns(own, CLONE_NEWNET) != 0:
                    # A thread stuck in a cluster namespace would talk to
                    # the wrong network from now on: stop here.
                    os.write(2, b"cluster: setns back failed\n")
                    os._exit(EXIT_FAILURE)
        finally:
            os.close(target)
            os.close(own)


def attach(tag):
    """A Cluster object for an existing detached cluster (from its record)
    whose down() removes it."""
    rec = _read_record(tag)
    if rec is None:
        raise ClusterError("no cluster with tag %s (cluster.py list)" % tag)
    d = rec["cluster"]
    c = Cluster(hosts=len(d["hosts"]), subnet=d["subnet"], tag=tag,
                detached=True)
    c._is_up = True
    return c


# ------------------------------------------------------------------ CLI


def _fill(template, c, i):
    """{addr}, {host}, {ns}, {tag} and {addr<j>} in a host command."""
    values = {"addr": c.addr(i), "host": str(i), "ns": c.ns(i), "tag": c.tag}
    for j in range(c.hosts):
        values["addr%d" % j] = c.addr(j)

    def sub(m):
        if m.group(1) not in values:
            raise ValueError("unknown placeholder {%s} in %r" % (
                m.group(1), template))
        return values[m.group(1)]
    return re.sub(r"\{([a-z0-9]+)\}", sub, template)


def _hosts_list(text, n):
    out = []
    for part in text.split(","):
        if not part.isdigit() or not 0 <= int(part) < n:
            raise ValueError("host %r: want 0..%d" % (part, n - 1))
        out.append(int(part))
    return out


def _cluster_from_args(a, detached=False):
    rates = a.rate
    if rates and len(rates) == 1:
        rates = rates * a.hosts
    rates = [None if r in ("none", "0") else r for r in rates or
             [None] * a.hosts]
    return Cluster(hosts=a.hosts, rates=rates, burst=a.burst,
                   latency=a.latency, subnet=a.subnet, tag=a.tag,
                   detached=detached, log=lambda m: print(m, file=sys.stderr))


def _cmd_run(a):
    c = _cluster_from_args(a)
    on = []
    for spec in a.on or []:
        hosts, _, cmd = spec.partition(":")
        on.append((_hosts_list(hosts, a.hosts), cmd))
    code = 0
    with c:
        for hosts, cmd in on:
            for i in hosts:
                argv = ["sh", "-c", _fill(cmd, c, i)]
                p = c.spawn(i, argv)
                print("h%d pid %d: %s" % (i, p.pid, argv[2]), file=sys.stderr)
        print(json.dumps(c.describe()), flush=True)
        deadline = time.time() + a.timeout if a.timeout else None
        main_proc = None
        if a.main is not None:
            hosts, _, cmd = a.main.partition(":")
            i = _hosts_list(hosts, a.hosts)[0]
            main_proc = c.spawn(i, ["sh", "-c", _fill(cmd, c, i)])
        # Until --main exits (its code), or without it until every host
        # command has exited (the largest code), or a signal, or --timeout.
        waited = [main_proc] if main_proc else c.procs
        while any(p.poll() is None for p in waited):
            if deadline and time.time() > deadline:
                print("cluster.py: --timeout %g s reached; tearing down" %
                      a.timeout, file=sys.stderr)
                return EXIT_TIMEOUT
            time.sleep(0.1)
        code = max([p.returncode for p in waited] or [0])
        if main_proc:
            print("main command exited %d" % code, file=sys.stderr)
    return code


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="cluster.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 ok, 1 failure, 2 usage, 3 unsupported host, "
        "124 run --timeout reached, 130 interrupted")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def shape_args(p):
        p.add_argument("--hosts", type=int, default=2)
        p.add_argument("--rate", action="append",
                       help="tc rate (e.g. 100mbit; 'none' = unshaped); once "
                       "for every host, or once per host in order")
        p.add_argument("--burst", type=int, help="tbf bucket in bytes "
                       "(default: 5 ms of the rate, >= 16 KiB)")
        p.add_argument("--latency", default="50ms")
        p.add_argument("--subnet", default=DEFAULT_SUBNET)
        p.add_argument("--tag", help="1-16 of [a-z0-9] (default: random)")

    sub.add_parser("check", help="exit 0 when clusters can be built here, "
                   "3 with the reason otherwise")
    p = sub.add_parser("up", help="build a detached cluster, print it as "
                       "JSON; `down --tag` removes it")
    shape_args(p)
    p = sub.add_parser("exec", help="run a command in a host of a detached "
                       "cluster: exec --tag T --host I -- CMD...")
    p.add_argument("--tag", required=True)
    p.add_argument("--host", type=int, required=True)
    p.add_argument("argv", nargs=argparse.REMAINDER)
    p = sub.add_parser("down", help="remove a cluster (processes, "
                       "namespaces, veths, bridge)")
    p.add_argument("--tag", required=True)
    p = sub.add_parser(
        "run", help="build a cluster, start host commands, wait (for --main "
        "or a signal), tear everything down",
        description="Host commands run under sh -c with {addr} (the host's "
        "address), {addr0}.. (any host's), {host}, {ns}, {tag} filled in.")
    shape_args(p)
    p.add_argument("--on", action="append", metavar="HOSTS:CMD",
                   help="e.g. '0:pcp --gateway ...' or '1,2:pcp --node-"
                   "manager --host {addr0} ...' (background)")
    p.add_argument("--main", metavar="HOST:CMD",
                   help="run this in the foreground; its exit ends the run "
                   "and is the exit code")
    p.add_argument("--timeout", type=float, default=0,
                   help="tear down and exit 124 after this many seconds "
                   "(0: no limit)")
    p = sub.add_parser("cleanup", help="remove leftovers")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--tag")
    g.add_argument("--all-stale", action="store_true",
                   help="every cluster whose owner process is gone")
    sub.add_parser("list", help="clusters on this machine, stale or not")
    a = ap.parse_args(argv)

    try:
        if a.cmd == "check":
            why = check_capabilities()
            if why:
                print("cluster.py: unsupported: %s" % why, file=sys.stderr)
                return EXIT_UNSUPPORTED
            print("cluster.py: network namespaces, veth, bridge and tbf "
                  "are available")
            return 0
        if a.cmd in ("up", "run") and not 1 <= a.hosts <= MAX_HOSTS:
            raise ValueError("--hosts %d: want 1..%d" % (a.hosts, MAX_HOSTS))
        if a.cmd == "run" and not 0 <= a.timeout <= 86400:
            raise ValueError("--timeout %g: want 0..86400 s" % a.timeout)
        if a.cmd in ("up", "run") and a.rate and len(a.rate) not in (
                1, a.hosts):
            raise ValueError("--rate: give it once or %d times" % a.hosts)
        if a.cmd == "up":
            c = _cluster_from_args(a, detached=True)
            c.up()
            print(json.dumps(c.describe()))
            return 0
        if a.cmd == "exec":
            c = attach(a.tag)
            argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
            if not argv:
                raise ValueError("exec: no command")
            return c.run(a.host, argv, timeout=None).returncode
        if a.cmd == "down":
            if a.tag not in list_namespaces():
                raise ClusterError("no cluster with tag %s" % a.tag)
            print(" ".join(remove_tag(a.tag)) or "(record only)")
            return 0
        if a.cmd == "run":
            return _cmd_run(a)
        if a.cmd == "cleanup":
            if a.all_stale:
                removed = cleanup_stale(log=print)
                if not removed:
                    print("no stale clusters")
                return 0
            if not TAG_RE.match(a.tag):
                raise ValueError("tag %r: want 1-16 of [a-z0-9]" % a.tag)
            print(" ".join(remove_tag(a.tag)) or "nothing to remove")
            return 0
        if a.cmd == "list":
            for tag, nss in sorted(list_namespaces().items()):
                rec = _read_record(tag) or {}
                print("%s %s owner=%s %s" % (
                    tag, "stale" if is_stale(tag) else "live",
                    "detached" if rec.get("detached") else
                    rec.get("owner_pid"), " ".join(sorted(nss))))
            return 0
    except Unsupported as e:
        print("cluster.py: unsupported: %s" % e, file=sys.stderr)
        return EXIT_UNSUPPORTED
    except (ValueError, ClusterError) as e:
        print("cluster.py: %s" % e, file=sys.stderr)
        return EXIT_USAGE if isinstance(e, ValueError) else EXIT_FAILURE
    except KeyboardInterrupt as e:
        print("cluster.py: interrupted (%s); torn down" % (str(e) or "SIGINT"),
              file=sys.stderr)
        return 130
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
