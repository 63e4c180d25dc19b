#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A torch-mlir style module trains through the service (issue 12, foreign
modules), on a real gateway and a node manager with two CPU workers.

  1. model_path = tests/fixtures/mlir/torch_resources.mlir (dense_resource
     constants, i64 ids; the workers' @diloco_round carries the blobs) with
     the experiment key iree_flags: the job succeeds, the parameter count is
     the module's (2 x 65 x 16), the loss falls from about ln 65;
  2. iree_flags naming a flag iree-compile does not know: the job fails
     and its error points at the compile log, which names the flag;
  3. 400s naming iree_flags: a refused flag (-o), a flag that writes files,
     more than 16 flags, a non-string item.
Every wait is bounded.
"""
import glob
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gateway_test as gt  # noqa: E402
import training_e2e_test as te  # noqa: E402

from gateway_test import check, is_error, request  # noqa: E402

ROOT = te.ROOT
MODULE = os.path.join(ROOT, "tests", "fixtures", "mlir",
                      "torch_resources.mlir")


def experiment(**extra):
    e = {"name": "torch-style", "model_path": MODULE, "data_path": te.DATA,
         "tokenizer": "char", "learning_rate": 0.03, "tau": 10,
         "outer_loop_steps": 4, "nesterov_momentum": 0.0,
         "outer_learning_rate": 1.0, "checkpoint_every": 100, "seed": 5}
    e.update(extra)
    return e


def bad_requests():
    cases = [
        experiment(iree_flags=["-o"]),
        experiment(iree_flags=["--iree-hal-dump-executable-files-to=/tmp"]),
        experiment(iree_flags=["--iree-opt-level=O2"] * 17),
        experiment(iree_flags=[3]),
    ]
    for body in cases:
        resp = request("POST", "/v1/training/jobs", body)
        check(is_error(resp, 400, "INVALID_ARGUMENT") and
              "iree_flags" in resp[1]["error"]["message"],
              "400 naming iree_flags for %s: %s" % (body["iree_flags"][:2],
                                                    resp))


def main():
    work = tempfile.mkdtemp(prefix="pcp-train-foreign-")
    gw = nm = None
    try:
        gw, nm = te.start_cluster(work)
        if gt.FAILURES:
            return 1
        bad_requests()

        # 1. The torch-mlir style module, with an extra compiler flag.
        job = te.submit(experiment(
            iree_flags=["--iree-llvmcpu-stack-allocation-limit=1048576"]))
        te.wait_done(job, 600)
        s, r = request("GET", "/v1/training/jobs/%s" % job)
        check(r.get("state") == "succeeded",
              "torch-style job succeeded: %s" % r.get("error", r))
        steps = te.steps_of(job)
        losses = [steps[k]["loss_mean"] for k in sorted(steps)]
        n = r.get("training", {}).get("parameter_count")
        print("torch-style module: %s params, loss_mean %s" % (
            n, " ".join("%.3f" % x for x in losses)))
        check(n == 2 * 65 * 16, "parameter count from the module: %s" % n)
        check(len(losses) == 4 and 3.9 < losses[0] < 4.4 and
              losses[-1] < losses[0] - 0.3,
              "loss falls from ~ln 65: %s" % losses)

        # 2. A flag iree-compile does not know fails the job, not the
        # gateway, and the compile log says which flag.
        job = te.submit(experiment(name="bad-flag", outer_loop_steps=1,
                                   iree_flags=["--iree-no-such-flag=1"]))
        te.wait_done(job, 300)
        s, r = request("GET", "/v1/training/jobs/%s" % job)
        error = str(r.get("error", ""))
        check(r.get("state") == "failed" and "compile" in error,
              "an unknown flag fails the job at compile: %s" % error[:300])
        logs = glob.glob(os.path.join(work, "state", "training", job,
                                      "compile-*.log"))
        text = "".join(open(p).read() for p in logs)
        check("--iree-no-such-flag" in text,
              "the compile log names the flag (%d logs)" % len(logs))
    finally:
        te.stop_all(nm, gw)
    if gt.FAILURES:
        print("training_foreign_test: %d failures (logs in %s)" % (
            len(gt.FAILURES), work))
        return 1
    print("training_foreign_test: all passed")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
