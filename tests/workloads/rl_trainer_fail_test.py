#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The GRPO trainer (src/workloads/rl/trainer.c): a task that FAILS on a
connected worker ends the call at once, even when it is the task the
trainer is waiting on and another worker's task runs on.

usage: rl_trainer_fail_test.py PCP_BINARY RL_TRAINER_TOOL

Two real `pcp --worker` processes (IREE on CPU) under rl_trainer_tool:
  - worker0 caps its resident session tensors at 1.5 x the parameters'
    bytes (--resident-memory-bytes): the reference fits, the policy beside
    it does not, so the update's policy upload fails there at once
    (RESOURCE_EXHAUSTED) while the worker stays connected;
  - worker1 sleeps 3 s in every task (--test-task-delay-ms).
Workers are taken in worker id order, so worker0's upload is the first
task of the phase, the one the wait looks at. The update must fail with
worker0's status within 2 s (measured: 0.00 s; not after worker1's 3 s
upload), and write nothing. Before the fix, the wait only looked for failures among the
tasks after the one it waited on, so it noticed worker0's failure only
once worker1's task had ended (3 s).

Random data (no JAX): the numbers of a step are rl_trainer_test.py's.
Prints one line per check and 'N passed, M failed'.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

PCP, TOOL = sys.argv[1], sys.argv[2]
B, T, V, A, ROWS = 4, 16, 64, 2, 24
DELAY_MS = 3000
JOIN = "rl-trainer-fail-test-token"

RESULTS = []


def check(label, ok, detail=""):
    RESULTS.append((label, bool(ok), detail))
    print("%s %s%s" % ("ok" if ok else "FAIL", label,
                       (": " + detail) if detail else ""), flush=True)


def start_worker(work, port, device, extra):
    env = dict(os.environ, PCP_WORKER_JOIN_TOKEN=JOIN)
    name = "worker%d" % device
    args = [PCP, "--worker", "--connect", "127.0.0.1:%d" % port,
            "--device-id", str(device), "--cpu-threads", "1",
            "--cache-dir", os.path.join(work, "cache-" + name)] + extra
    err = open(os.path.join(work, name + ".err"), "a")
    return subprocess.Popen(args, env=env, stderr=err,
                            stdout=subprocess.DEVNULL)


def main():
    with tempfile.TemporaryDirectory() as work:
        os.environ.setdefault("PCP_CACHE_DIR", os.path.join(work, "cache"))
        pjson = os.path.join(work, "params.json")
        subprocess.run([PCP, "model", "gpt", "--layers", "2", "--heads", "4",
                        "--width", "32", "--vocab", str(V), "--block-size",
                        str(T), "--batch", str(B), "-o",
                        os.path.join(work, "m.mlir"), "--params-json", pjson],
                       check=True, capture_output=True, timeout=300)
        with open(pjson) as f:
            table = json.load(f)
        count = sum(int(np.prod(e["shape"])) for e in table["parameters"])
        rng = np.random.default_rng(17)
        params = (0.1 * rng.standard_normal(count)).astype(np.float32)
        ids = rng.integers(0, V, size=(ROWS, T), dtype=np.int32)
        mask = np.zeros((ROWS, T), np.float32)
        mask[:, 4:] = 1.0
        arrays = {"params.f32": params, "ref_params.f32": params,
                  "m.f32": np.zeros(count, np.float32),
                  "v.f32": np.zeros(count, np.float32),
                  "input_ids.i32": ids.astype("<i4"),
                  "targets.i32": np.roll(ids, -1, axis=1).astype("<i4"),
                  "mask.f32": mask,
                  "old_logp.f32": np.full((ROWS, T), -4.0, np.float32),
                  "advantages.f32": rng.standard_normal(ROWS).astype(
                      np.float32)}
        config = {"pcp": PCP, "arch": "gpt", "layers": 2, "heads": 4,
                  "width": 32, "vocab": V, "block_size": T, "batch": B,
                  "accumulate": A, "rows": ROWS, "workers": 2,
                  "max_workers": 2, "capture_status": 1}
        d = os.path.join(work, "run")
        os.makedirs(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config, f)
        for name, a in arrays.items():
            a.tofile(os.path.join(d, name))
        env = dict(os.environ, PCP_WORKER_JOIN_TOKEN=JOIN)
        tool = subprocess.Popen([TOOL, d], env=env, stdout=subprocess.PIPE,
                                stderr=open(os.path.join(d, "tool.err"), "w"),
                                text=True)
        procs = []
        try:
            line = tool.stdout.readline()
            if not line.startswith("port "):
                raise RuntimeError("tool did not print its port: %r" % line)
            port = int(line.split()[1])
            limit = str(count * 4 * 3 // 2)
            procs = [start_worker(d, port, 0,
                                  ["--resident-memory-bytes", limit]),
                     start_worker(d, port, 1,
                                  ["--test-task-delay-ms", str(DELAY_MS)])]
            rc = tool.wait(timeout=600)
            with open(os.path.join(d, "tool.err")) as f:
                tool_err = f.read()[-2000:]
            check("the tool ran", rc == 0, "exit %d %s" % (rc, tool_err))
            with open(os.path.join(d, "result.json")) as f:
                r = json.load(f)
            out = np.fromfile(os.path.join(d, "params_out.f32"), "<f4")
            same = np.array_equal(out, params)
            wall = r.get("update_wall_s", -1.0)
            check("a task failing on a connected worker fails the update at "
                  "once (not after the other worker's %d ms task), nothing "
                  "written" % DELAY_MS,
                  r.get("status") == "RESOURCE_EXHAUSTED" and
                  0 <= wall < 2.0 and
                  same,
                  "%s after %.2f s (%s), params %s" % (
                      r.get("status"), wall, r.get("message", "")[:160],
                      "unchanged" if same else "CHANGED"))
        except Exception as exc:
            check("the run", False, str(exc))
        finally:
            if tool.poll() is None:
                tool.kill()
                tool.wait()
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    failed = sum(1 for _, ok, _ in RESULTS if not ok)
    print("%d passed, %d failed" % (len(RESULTS) - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
