# SPDX-License-Identifier: Apache-2.0
"""bench/slow_link: wall-clock to a target training loss of ddp against
decoupled DiLoCo (int4 deltas) with 4 CPU workers, each on its own host
behind a 100 Mbit/s link (tools/cluster/pcp_cluster.py: network namespaces,
veth pairs, tc tbf in both directions; the gateway's host unshaped).

Run by build/bench/slow_link (argv: pcp binary, then options). One cluster
for both modes. Per mode, first a short warm-up job of the same model (so
the programs are compiled and every worker has fetched them over its link:
one-off costs, printed, not in the timing), then the measured job: the
clock starts at its submit and stops at the first progress report whose
smoothed training loss (the mean of the last 3 reports: every `tau` = 10
steps for ddp; for decoupled every fragment sync: with sync_interval_h 20
and 2 fragments at offsets 0 and 1, syncer steps 20k and 20k + 1)
is at or under the target; the job is then cancelled. A job that does not
reach the target within its steps or its time budget gives its time to
budget and the loss it reached (every wait is bounded).

Model: the char GPT of the end-to-end test (2 layers, width 192, block 64,
batch 16: ~0.91M parameters; --quick: 1 layer, ~0.47M, target 2.9). ddp moves 8 bytes per parameter per worker
per step (gradients up, the average down): ~7.3 MB, 0.58 s of a 100 Mbit/s
link, against ~0.2-0.4 s of compute per step on this machine. Decoupled
syncs each of its 2 fragments once per 20 steps (sync_interval_h 20,
offsets 0 and 1): int4 deltas up and the merged fragment down in f32.

Last line: `slow_link ratio=<x>`, x = ddp's seconds to the target /
decoupled's (when ddp misses the target: its time to budget, a lower bound
of the ratio, said so). Under PCP_BENCH_CHECK=1 the bench fails when
decoupled misses the target or x < 1.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools", "cluster"))
import cluster  # noqa: E402
import pcp_cluster  # noqa: E402

sys.path.insert(0, HERE)
import diloco_comm as dc  # noqa: E402

DATA = os.path.join(HERE, "..", "data", "tiny_shakespeare.txt")
SMOOTH = 3


def run_to_target(pc, body, mode, target, budget):
    """Submits |body| and polls its step events: (seconds to the target or
    None, seconds run, last smoothed loss, reports, job id, inner step of
    the last report)."""
    t0 = time.time()
    s, r = pc.request("POST", "/v1/training/jobs", body)
    if s != 202:
        raise RuntimeError("%s job not accepted: %s %s" % (mode, s, r))
    job = r["job_id"]
    reached, smoothed, reports, state = None, float("nan"), 0, "running"
    at = 0
    while time.time() - t0 < budget:
        s, ev = pc.request("GET", "/v1/jobs/%s/events" % job)
        steps = [e["payload"] for e in (ev or {}).get("events", [])
                 if e["type"] == "training.step" and
                 isinstance(e["payload"].get("loss"), (int, float))]
        losses = [p["loss"] for p in steps]
        reports = len(losses)
        if steps:
            at = dc.inner_steps_of(mode, body, steps[-1])
        if losses:
            tail = losses[-SMOOTH:]
            smoothed = sum(tail) / len(tail)
            if len(losses) >= SMOOTH and smoothed <= target:
                reached = time.time() - t0
                break
        s, j = pc.request("GET", "/v1/training/jobs/" + job)
        state = (j or {}).get("state", "?") if s == 200 else "?"
        if state in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.5)
    wall = time.time() - t0
    if state not in ("succeeded", "failed", "cancelled"):
        pc.request("POST", "/v1/jobs/%s/cancel" % job)
        pc.wait_for(lambda: pc.request("GET", "/v1/training/jobs/" + job)[1]
                    .get("state") in ("succeeded", "failed", "cancelled"),
                    60, period=0.5)
    if state == "failed":
        raise RuntimeError("%s job %s failed: %s" % (
            mode, job, pc.request("GET", "/v1/training/jobs/" + job)[1]))
    return reached, wall, smoothed, reports, job, at


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("pcp")
    parser.add_argument("--quick", action="store_true",
                        help="a smaller model, a looser target")
    parser.add_argument("--rate", default="100mbit")
    parser.add_argument("--target", type=float, default=0.0,
                        help="training loss (default 2.7, quick 2.9)")
    parser.add_argument("--steps", type=int, default=0,
                        help="inner steps per worker at most (default 300, "
                        "quick 150)")
    parser.add_argument("--budget-s", type=int, default=0,
                        help="per measured job (default 240, quick 120)")
    args = parser.parse_args()
    why = cluster.check_capabilities()
    if why is not None:
        print("slow_link: cannot run: this host cannot build a "
              "network-namespace cluster (needs root, ip, tc, veth, tbf): "
              "%s" % why, file=sys.stderr)
        return 1
    try:
        rate_bits = cluster.parse_rate(args.rate)
    except ValueError as e:
        parser.error(str(e))
    target = args.target or (2.9 if args.quick else 2.7)
    steps = args.steps or (150 if args.quick else 300)
    budget = args.budget_s or (120 if args.quick else 240)
    if not 1.0 <= target <= 5.0 or not 20 <= steps <= 5000 or \
            not 10 <= budget <= 1800:
        parser.error("--target 1..5, --steps 20..5000, --budget-s 10..1800")
    if args.quick:
        model = {"kind": "gpt", "layers": 1, "heads": 4, "width": 192,
                 "vocab": 65, "block_size": 64, "batch": 16}
    else:
        model = {"kind": "gpt", "layers": 2, "heads": 4, "width": 192,
                 "vocab": 65, "block_size": 64, "batch": 16}
    tau = 10
    work = tempfile.mkdtemp(prefix="pcp-bench-slow-")
    cluster.cleanup_stale(log=print)
    results = {}
    try:
        data = os.path.join(work, "text.txt")
        with open(DATA, "rb") as src, open(data, "wb") as dst:
            dst.write(src.read())
        t_up = time.time()
        with pcp_cluster.PcpCluster(args.pcp, work, worker_hosts=4,
                                    rate=args.rate, scale=1,
                                    log=lambda *a: None) as pc:
            print("slow_link: 4 CPU workers, each host behind %s (tbf both "
                  "ways), gateway unshaped; cluster up in %.1f s; model gpt "
                  "%d layers width 192 block 64 batch 16; target smoothed "
                  "training loss %.2f within %d steps / %d s per mode" % (
                      args.rate, time.time() - t_up, model["layers"], target,
                      steps, budget), flush=True)
            for mode in ("ddp", "decoupled_int4"):
                # H 20 with 2 fragments: the whole model every 20 steps
                # (ddp reports every tau = 10).
                warm = dc.experiment(mode, model, 20, 20 if mode !=
                                     "ddp" else tau, data)
                if mode == "ddp":
                    warm.update(outer_loop_steps=1)
                t0 = time.time()
                moved0 = sum(w["bytes_to_worker"] + w["bytes_from_worker"]
                             for w in pc.workers())
                try:
                    _, job, _ = dc.run_job(pc.request, warm, budget)
                except dc.NotAvailable as e:
                    print("slow_link: %s not available in this build (%s)" %
                          (mode, str(e)[:300]), flush=True)
                    continue
                except RuntimeError as e:
                    if mode == "ddp" and "aggregation_strategy" in str(e):
                        print("slow_link: ddp not available: %s" % e)
                        continue
                    raise
                n = job.get("training", {}).get("parameter_count", 0)
                warm_s = time.time() - t0
                moved = (sum(w["bytes_to_worker"] + w["bytes_from_worker"]
                             for w in pc.workers()) - moved0) / 4
                if mode == "ddp" and moved < 0.5 * 8 * n * tau:
                    # A build without ddp ran it as classic DiLoCo.
                    print("slow_link: ddp not available in this build (its "
                          "warm-up moved %.0f bytes per worker over %d "
                          "steps of %d parameters: no per-step gradient "
                          "exchange)" % (moved, tau, n), flush=True)
                    continue
                before = [pc.link_bytes(i) for i in range(1, 5)]
                body = dc.experiment(mode, model, steps, 20 if mode != "ddp"
                                     else tau, data)
                reached, wall, loss, reports, job_id, at = run_to_target(
                    pc, body, mode, target, budget)
                after = [pc.link_bytes(i) for i in range(1, 5)]
                link = [(a[0] - b[0], a[1] - b[1])
                        for a, b in zip(after, before)]
                busy = max(max(u, d) for u, d in link) * 8 / rate_bits
                results[mode] = {"reached": reached, "wall": wall,
                                 "loss": loss, "n": n}
                print("%-15s N=%d warm-up %.1f s; %s after %.1f s "
                      "(%d reports, inner step %d, %.2f s per step, "
                      "smoothed loss %.4f); tbf bytes per "
                      "worker link up/down %s; busiest link direction "
                      "%.1f s of %s" % (
                          mode, n, warm_s,
                          "target reached" if reached else
                          "target NOT reached, stopped", reached or wall,
                          reports, at, (reached or wall) / max(1, at), loss,
                          " ".join("%d/%d" % x for x in link), busy,
                          args.rate), flush=True)
                if mode == "ddp" and reports:
                    per_step = 8.0 * n / (rate_bits / 8)
                    print("ddp: 8 x N = %d bytes per worker per step, "
                          "%.2f s of link time; %.2f s per step measured" % (
                              8 * n, per_step,
                              (reached or wall) / max(1, at)),
                          flush=True)
    except pcp_cluster.PcpClusterError as e:
        print("slow_link: the cluster did not come up: %s" % e,
              file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if "ddp" not in results:
        print("slow_link: ddp not available; no ratio")
        return 1
    ddp, dec = results["ddp"], results["decoupled_int4"]
    if not dec["reached"]:
        print("slow_link: decoupled did not reach %.2f (loss %.4f after "
              "%.1f s); no ratio" % (target, dec["loss"], dec["wall"]))
        return 1
    check = os.environ.get("PCP_BENCH_CHECK", "") not in ("", "0")
    if ddp["reached"]:
        ratio = ddp["reached"] / dec["reached"]
        print("time to loss %.2f: ddp %.1f s, decoupled+int4 %.1f s" % (
            target, ddp["reached"], dec["reached"]))
    else:
        ratio = ddp["wall"] / dec["reached"]
        print("time to loss %.2f: ddp did not reach it in %.1f s (loss "
              "%.4f): the ratio is a lower bound; decoupled+int4 %.1f s" % (
                  target, ddp["wall"], ddp["loss"], dec["reached"]))
    ok = ratio >= 1.0
    print("slow_link goal decoupled faster than ddp to the target: %s" % (
        "met" if ok else "MISSED"))
    print("slow_link ratio=%.2f" % ratio)
    return 1 if (check and not ok) else 0


if __name__ == "__main__":
    sys.exit(main())
