#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The GRPO trainer (src/workloads/rl/trainer.c) on real workers, against
JAX.

usage: rl_trainer_test.py PCP_BINARY RL_TRAINER_TOOL

`rl_trainer_tool` is the gateway side: a fabric endpoint on 127.0.0.1 and
a compile queue in this process's child, the trainer's programs compiled
through the queue and registered, and real `pcp --worker` processes (IREE
on CPU) started here. A tiny GPT (2 layers, width 32, vocab 64, T 16), a
micro-batch of B = 4 rows, A = 2 micro-batches per task, a batch of 24
rows (6 micro-batches, 3 gradient tasks: 3 on one worker, or 2 + 1 over
two), completions of different lengths behind masked prompts and padding,
old_logp away from the policy so the ratio moves and the clip binds,
sampling temperature 0.7, beta 0.04, AdamW at step 5 from non-zero
moments, the global-norm clip engaged (half the gradient's norm).

The reference (JAX, independent of the MLIR): jax_reference.py's forward,
logp = log_softmax(logits / T)[target], the GRPO objective as the token
mean over the WHOLE batch (not per micro-batch or per worker), its
gradient by jax.grad, the global-norm clip and AdamW written out here from
docs/autodiff.md's formulas. Checks:
  - ref_logp equals the reference's logp under the reference parameters
    at T, at every position (the trainer writes them unmasked);
  - m' recovers the clipped gradient: (m' - b1 m) / (1 - b1) equals JAX's
    clipped gradient of the whole batch's token mean, so the workers'
    gradients with token_normalizer = N / A summed to the step's gradient:
    its direction here (a per-micro-batch token mean weighs the
    micro-batches' tokens differently), its scale in the reported
    gradient norm and loss below, which the clip does not hide (a mean
    over tasks instead of a sum is off by a factor of 3);
  - params', m', v' equal the hand-written AdamW step;
  - the metrics (loss, mean KL, clip fractions, mean ratio, gradient
    norm before the clip, tokens, workers) equal the reference's;
  - one worker and two workers give the same parameters;
  - with worker_class "rl" and two workers of classes "other" and "rl",
    only the "rl" worker takes part (and the step is the same);
  - a second update (step 6 from step 5's result, same batch) equals
    AdamW again: the sessions' resident tensors are replaced, not stale;
  - a worker SIGKILLed during the update fails the call (its status),
    nothing written;
  - a task past task_timeout_ms fails ref_logp DEADLINE_EXCEEDED;
  - a stop hook that turns true during the update ends it CANCELLED with
    nothing written, within 300 ms of the stop, although the worker's
    running task goes on for 1.5 s (workers delayed 1500 ms per task): the
    trainer cancels, returns, and keeps what the task borrows until it
    ends.

Tolerances (f32): ref_logp 1e-4 absolute; gradient 1e-4 of its tensor's
largest magnitude (the models' JAX tests' tolerance); params' within 1e-3
of the step's largest change (an AdamW error, a missing bias correction
or clip, is of the order of the change itself); m', v' 1e-4 of their
largest magnitude; metrics 1e-5 absolute + relative.

Prints one line per check and 'N passed, M failed'.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "models"))
import jax_reference as ref  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

PCP, TOOL = sys.argv[1], sys.argv[2]
B, T, V, A, ROWS = 4, 16, 64, 2, 24
TEMPERATURE, BETA, CLIP_LOW, CLIP_HIGH = 0.7, 0.04, 0.2, 0.28
B1, B2, EPS, WD, LR, STEP = 0.9, 0.999, 1e-8, 0.01, 1e-2, 5
JOIN = "rl-trainer-test-token"

RESULTS = []


def check(label, ok, detail=""):
    RESULTS.append((label, bool(ok), detail))
    print("%s %s%s" % ("ok" if ok else "FAIL", label,
                       (": " + detail) if detail else ""), flush=True)


def run(args, timeout=300):
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(args[:3]),
                                                   p.returncode,
                                                   (p.stdout + p.stderr)[-3000:]))
    return p.stdout


def make_parameters(table, rng):
    values = []
    for e in table["parameters"]:
        shape = tuple(e["shape"])
        if e["init"] == "ones":
            x = 1.0 + 0.1 * rng.standard_normal(shape)
        elif e["init"] == "zeros":
            x = 0.1 * rng.standard_normal(shape)
        elif "wte" in e["name"] or "wpe" in e["name"]:
            x = rng.standard_normal(shape)
        else:
            x = rng.standard_normal(shape) / np.sqrt(shape[1])
        values.append(x.astype(np.float32))
    return values


def objective(table):
    def token_logp(params, ids, targets):
        logits = ref.logits(table, params, ids) / TEMPERATURE
        logp = jax.nn.log_softmax(logits, axis=-1)
        return jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]

    def loss(params, ids, targets, mask, old, reflp, adv):
        logp = token_logp(params, ids, targets)
        ratio = jnp.exp(logp - old)
        a = adv[:, None]
        surrogate = jnp.where(a >= 0, jnp.minimum(ratio, 1.0 + CLIP_HIGH) * a,
                              jnp.maximum(ratio, 1.0 - CLIP_LOW) * a)
        d = reflp - logp
        kl = jnp.exp(d) - d - 1.0
        tokens = jnp.sum(mask)
        value = -jnp.sum(mask * (surrogate - BETA * kl)) / tokens
        low = jnp.where((ratio < 1.0 - CLIP_LOW) & (a < 0), 1.0, 0.0)
        high = jnp.where((ratio > 1.0 + CLIP_HIGH) & (a > 0), 1.0, 0.0)
        metrics = [jnp.sum(mask * m) / tokens for m in (kl, low, high, ratio)]
        return value, metrics

    return token_logp, jax.value_and_grad(loss, has_aux=True)


def batch(rng, policy_logp_fn):
    ids = rng.integers(0, V, size=(ROWS, T), dtype=np.int32)
    targets = np.roll(ids, -1, axis=1)
    targets[:, -1] = rng.integers(0, V, size=ROWS)
    mask = np.zeros((ROWS, T), np.float32)
    for r in range(ROWS):
        prompt = int(rng.integers(1, 8))
        end = T - int(rng.integers(0, 8))  # completions of different lengths
        mask[r, prompt:max(end, prompt + 1)] = 1.0
    mask[ROWS - 2:] = 0.0  # two pad rows
    logp = np.asarray(policy_logp_fn(ids, targets), np.float32)
    old = (logp + 0.3 * rng.standard_normal((ROWS, T))).astype(np.float32)
    rewards = rng.standard_normal(ROWS).reshape(-1, 4)
    adv = ((rewards - rewards.mean(1, keepdims=True)) /
           (rewards.std(1, ddof=1, keepdims=True) + 1e-4)).reshape(-1)
    adv[ROWS - 2:] = 0.0
    return ids, targets, mask, old, adv.astype(np.float32)


def start_worker(work, port, device, delay_ms=0, worker_class=None):
    env = dict(os.environ, PCP_WORKER_JOIN_TOKEN=JOIN)
    name = "worker%d" % device
    args = [PCP, "--worker", "--connect", "127.0.0.1:%d" % port,
            "--device-id", str(device), "--cpu-threads", "1",
            "--cache-dir", os.path.join(work, "cache-" + name)]
    if delay_ms:
        args += ["--test-task-delay-ms", str(delay_ms)]
    if worker_class:
        args += ["--worker-class", worker_class]
    err = open(os.path.join(work, name + ".err"), "a")
    return subprocess.Popen(args, env=env, stderr=err,
                            stdout=subprocess.DEVNULL)


def run_tool(work, name, config, arrays, workers, delay_ms=0, classes=None,
             on_update=None):
    """One tool run with |workers| real workers; returns its directory.
    on_update(workers' Popen list) runs when the tool prints "update"."""
    d = os.path.join(work, name)
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    for fname, a in arrays.items():
        a.tofile(os.path.join(d, fname))
    env = dict(os.environ, PCP_WORKER_JOIN_TOKEN=JOIN)
    err = open(os.path.join(d, "tool.err"), "w")
    tool = subprocess.Popen([TOOL, d], env=env, stdout=subprocess.PIPE,
                            stderr=err, text=True)
    procs = []
    try:
        line = tool.stdout.readline()
        if not line.startswith("port "):
            raise RuntimeError("tool did not print its port: %r" % line)
        port = int(line.split()[1])
        procs = [start_worker(d, port, i, delay_ms,
                              classes[i] if classes else None)
                 for i in range(workers)]
        if on_update:
            line = tool.stdout.readline()
            if line.strip() != "update":
                raise RuntimeError("tool did not report the update: %r" % line)
            on_update(procs)
        rc = tool.wait(timeout=600)
        if rc != 0:
            with open(os.path.join(d, "tool.err")) as f:
                raise RuntimeError("rl_trainer_tool %s exited %d: %s" % (
                    name, rc, f.read()[-3000:]))
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
    return d


def load(d, name, count):
    return np.fromfile(os.path.join(d, name), "<f4", count=count)


def flat(tensors):
    return np.concatenate([np.asarray(x, np.float32).reshape(-1)
                           for x in tensors])


def split(vector, table):
    out, at = [], 0
    for e in table["parameters"]:
        size = int(np.prod(e["shape"]))
        out.append(vector[at:at + size].reshape(e["shape"]))
        at += size
    return out


def close(got, want, tol=1e-5):
    return abs(float(got) - float(want)) <= tol * (1.0 + abs(float(want)))


def main():
    with tempfile.TemporaryDirectory() as work:
        os.environ.setdefault("PCP_CACHE_DIR", os.path.join(work, "cache"))
        pjson = os.path.join(work, "params.json")
        run([PCP, "model", "gpt", "--layers", "2", "--heads", "4", "--width",
             "32", "--vocab", str(V), "--block-size", str(T), "--batch",
             str(B), "-o", os.path.join(work, "m.mlir"), "--params-json",
             pjson])
        with open(pjson) as f:
            table = json.load(f)
        rng = np.random.default_rng(16)
        params = make_parameters(table, rng)
        # A reference near the policy (KL of order 0.01, as after a few
        # updates).
        reference = [(p + 0.005 * rng.standard_normal(p.shape)).astype(
            np.float32) for p in params]
        token_logp, value_and_grad = objective(table)
        jp = [jnp.asarray(p) for p in params]
        jr = [jnp.asarray(p) for p in reference]
        ids, targets, mask, old, adv = batch(
            rng, lambda i, t: token_logp(jp, i, t))
        ref_logp = np.asarray(token_logp(jr, ids, targets), np.float32)

        (loss, metrics), grads = value_and_grad(
            jp, ids, targets, mask, old, ref_logp, adv)
        g = flat(grads).astype(np.float64)
        norm = float(np.sqrt(np.sum(g * g)))
        # Moments of the gradient's own scale, as after a few steps: the
        # step then depends smoothly on the gradient (from zero moments,
        # step 1 is lr * sign(g) and rounding decides tiny elements).
        rms = norm / np.sqrt(g.size)
        m0 = [(0.5 * rms * rng.standard_normal(p.shape)).astype(np.float32)
              for p in params]
        v0 = [(rms * rms * (0.5 + rng.random(p.shape))).astype(np.float32)
              for p in params]
        clip = 0.5 * norm  # engaged: the clip halves the gradient
        gc = g * clip / max(norm, clip)
        mf, vf, pf = (flat(m0).astype(np.float64), flat(v0).astype(np.float64),
                      flat(params).astype(np.float64))
        m1 = B1 * mf + (1 - B1) * gc
        v1 = B2 * vf + (1 - B2) * gc * gc
        p1 = pf - LR * ((m1 / (1 - B1 ** STEP)) /
                        (np.sqrt(v1 / (1 - B2 ** STEP)) + EPS) + WD * pf)
        count = pf.size

        # Step 6 from step 5's result on the same batch (the trainer's second
        # update; the clip constant is compiled in, the norm is new).
        p1_list = split(p1.astype(np.float32), table)
        (_, _), grads2 = value_and_grad(
            [jnp.asarray(x) for x in p1_list], ids, targets, mask, old,
            ref_logp, adv)
        g2 = flat(grads2).astype(np.float64)
        norm2 = float(np.sqrt(np.sum(g2 * g2)))
        gc2 = g2 * clip / max(norm2, clip)
        m2 = B1 * m1 + (1 - B1) * gc2
        v2 = B2 * v1 + (1 - B2) * gc2 * gc2
        p2 = p1 - LR * ((m2 / (1 - B1 ** (STEP + 1))) /
                        (np.sqrt(v2 / (1 - B2 ** (STEP + 1))) + EPS) + WD * p1)

        config = {"pcp": PCP, "arch": "gpt", "layers": 2, "heads": 4,
                  "width": 32, "vocab": V, "block_size": T, "batch": B,
                  "accumulate": A, "rows": ROWS, "beta1": B1, "beta2": B2,
                  "eps": EPS, "weight_decay": WD, "grad_clip": clip,
                  "lr": LR, "step": STEP, "clip_low": CLIP_LOW,
                  "clip_high": CLIP_HIGH, "beta": BETA,
                  "temperature": TEMPERATURE,
                  "artifacts": os.path.join(work, "artifacts")}
        arrays = {"params.f32": flat(params), "ref_params.f32": flat(reference),
                  "m.f32": flat(m0), "v.f32": flat(v0),
                  "input_ids.i32": ids.astype("<i4"),
                  "targets.i32": targets.astype("<i4"),
                  "mask.f32": mask, "old_logp.f32": old,
                  "advantages.f32": adv}

        outs = {}
        for workers in (1, 2):
            label = "%d worker%s" % (workers, "s" if workers > 1 else "")
            cfg = dict(config, workers=workers, max_workers=workers,
                       ref_logp_twice=1, updates=2)
            try:
                start = time.time()
                d = run_tool(work, "w%d" % workers, cfg, arrays, workers)
                elapsed = time.time() - start
            except Exception as exc:  # a failed run fails its checks
                check(label + ": run", False, str(exc))
                continue
            outs[workers] = d
            got_ref = load(d, "ref_logp.f32", ROWS * T).reshape(ROWS, T)
            err = float(np.max(np.abs(got_ref - ref_logp)))
            check(label + ": ref_logp = log_softmax(logits / T)[target] under "
                  "the reference", err <= 1e-4, "max abs err %.2e" % err)
            p_out = load(d, "params_out.f32", count).astype(np.float64)
            m_out = load(d, "m_out.f32", count).astype(np.float64)
            v_out = load(d, "v_out.f32", count).astype(np.float64)
            # The clipped gradient the step used, recovered from m'.
            g_got = (m_out - B1 * mf) / (1 - B1)
            worst, problems = 0.0, []
            for e, got_t, want_t in zip(table["parameters"],
                                        split(g_got, table),
                                        split(gc, table)):
                scale = float(np.max(np.abs(want_t)))
                rel = float(np.max(np.abs(got_t - want_t))) / scale
                worst = max(worst, rel)
                if not rel <= 1e-4:
                    problems.append("d%s %.2e" % (e["name"], rel))
            check(label + ": the summed worker gradients are the whole batch's "
                  "token-mean gradient (clipped)", not problems,
                  "; ".join(problems[:4]) if problems else
                  "worst rel err %.2e over %d tensors" % (
                      worst, len(table["parameters"])))
            change = float(np.max(np.abs(p1 - pf)))
            p_err = float(np.max(np.abs(p_out - p1)))
            m_err = float(np.max(np.abs(m_out - m1))) / float(
                np.max(np.abs(m1)))
            v_err = float(np.max(np.abs(v_out - v1))) / float(
                np.max(np.abs(v1)))
            check(label + ": params', m', v' = AdamW (global-norm clip) on "
                  "JAX's gradient",
                  p_err <= 1e-3 * change and m_err <= 1e-4 and v_err <= 1e-4,
                  "params err %.2e of the step's %.2e, m rel %.2e, v rel "
                  "%.2e" % (p_err, change, m_err, v_err))
            p_out2 = load(d, "params_out2.f32", count).astype(np.float64)
            change2 = float(np.max(np.abs(p2 - p1)))
            p2_err = float(np.max(np.abs(p_out2 - p2)))
            check(label + ": a second update (step 6, resident tensors "
                  "overwritten) = AdamW again", p2_err <= 1e-3 * change2,
                  "params err %.2e of the step's %.2e" % (p2_err, change2))
            with open(os.path.join(d, "result.json")) as f:
                r = json.load(f)
            want = {"loss": float(loss), "mean_kl": float(metrics[0]),
                    "clip_low_fraction": float(metrics[1]),
                    "clip_high_fraction": float(metrics[2]),
                    "mean_ratio": float(metrics[3])}
            bad = ["%s %.7g vs %.7g" % (k, r[k], w) for k, w in want.items()
                   if not close(r[k], w)]
            if not abs(r["grad_norm"] - norm) <= 1e-4 * norm:
                bad.append("grad_norm %.7g vs %.7g" % (r["grad_norm"], norm))
            if r["completion_tokens"] != int(mask.sum()):
                bad.append("tokens %d vs %d" % (r["completion_tokens"],
                                                int(mask.sum())))
            if r["workers"] != workers:
                bad.append("workers %d" % r["workers"])
            if not (want["clip_low_fraction"] > 0 and
                    want["clip_high_fraction"] > 0):
                bad.append("the case does not clip both sides")
            check(label + ": metrics", not bad, "; ".join(bad) if bad else
                  "loss %.6f, kl %.4f, clip %.3f/%.3f, ratio %.4f, grad norm "
                  "%.4f, %d tokens, update %.2f s (run %.1f s)" % (
                      r["loss"], r["mean_kl"], r["clip_low_fraction"],
                      r["clip_high_fraction"], r["mean_ratio"],
                      r["grad_norm"], r["completion_tokens"], r["seconds"],
                      elapsed))
        if 1 in outs and 2 in outs:
            for name in ("params_out.f32", "params_out2.f32"):
                a = load(outs[1], name, count)
                b = load(outs[2], name, count)
                diff = float(np.max(np.abs(a - b)))
                check("1 worker vs 2 workers: same parameters (%s)" % name,
                      diff <= 1e-6 * float(np.max(np.abs(a))),
                      "max diff %.2e (%s)" % (diff, "bitwise equal"
                                              if np.array_equal(a, b) else
                                              "not bitwise"))

        # Worker classes: two workers, one of the trainer's class; the
        # step runs on that one alone and equals the 1-worker step.
        cfg = dict(config, workers=2, max_workers=2, worker_class="rl")
        try:
            d = run_tool(work, "class", cfg, arrays, 2,
                         classes=["other", "rl"])
            with open(os.path.join(d, "result.json")) as f:
                r = json.load(f)
            same = 1 in outs and np.array_equal(
                load(d, "params_out.f32", count),
                load(outs[1], "params_out.f32", count))
            check("worker_class 'rl' with workers of classes 'other' and "
                  "'rl': only the 'rl' worker computes, same step",
                  r["workers"] == 1 and same,
                  "%d worker(s), params %s the 1-worker run's" % (
                      r["workers"], "equal to" if same else "DIFFERENT from"))
        except Exception as exc:
            check("worker_class", False, str(exc))

        # A worker killed during the update: the call fails with the
        # worker's loss, nothing written.
        cfg = dict(config, workers=1, max_workers=1, capture_status=1,
                   report_update=1)

        def kill_first(procs):
            time.sleep(0.3)  # the policy upload task is running (1.5 s)
            procs[0].send_signal(signal.SIGKILL)

        try:
            d = run_tool(work, "kill", cfg, arrays, 1, delay_ms=1500,
                         on_update=kill_first)
            with open(os.path.join(d, "result.json")) as f:
                r = json.load(f)
            same = np.array_equal(load(d, "params_out.f32", count),
                                  flat(params))
            check("worker killed during the update: the call fails, nothing "
                  "written",
                  r.get("status") not in (None, "OK", "CANCELLED") and same,
                  "%s after %.2f s (%s), params %s" % (
                      r.get("status"), r.get("update_wall_s", -1),
                      r.get("message", "")[:120],
                      "unchanged" if same else "CHANGED"))
        except Exception as exc:
            check("worker killed during the update", False, str(exc))

        # A task past task_timeout_ms (300 ms; the worker takes 1.5 s per
        # task): ref_logp fails DEADLINE_EXCEEDED soon after, nothing written.
        cfg = dict(config, workers=1, max_workers=1, task_timeout_ms=300,
                   capture_ref_logp_status=1)
        try:
            d = run_tool(work, "timeout", cfg, arrays, 1, delay_ms=1500)
            with open(os.path.join(d, "result.json")) as f:
                r = json.load(f)
            wall = r.get("ref_logp_wall_s", -1)
            check("a task past task_timeout_ms: DEADLINE_EXCEEDED, nothing "
                  "written",
                  r.get("status") == "DEADLINE_EXCEEDED" and 0.3 <= wall < 1.0
                  and not np.any(load(d, "ref_logp_after_failure.f32",
                                      ROWS * T)),
                  "%s after %.2f s (%s)" % (r.get("status"), wall,
                                            r.get("message", "")[:100]))
        except Exception as exc:
            check("task timeout", False, str(exc))

        # Stop during the update: CANCELLED, nothing written.
        cfg = dict(config, workers=1, max_workers=1, stop_after_ms=200)
        try:
            d = run_tool(work, "stop", cfg, arrays, 1, delay_ms=1500)
            with open(os.path.join(d, "result.json")) as f:
                r = json.load(f)
            same = np.array_equal(load(d, "params_out.f32", count),
                                  flat(params))
            same = same and np.array_equal(load(d, "m_out.f32", count),
                                           flat(m0))
            latency = r["update_wall_s"] - 0.2
            check("stop during the update: CANCELLED within 300 ms, nothing "
                  "written",
                  r.get("status") == "CANCELLED" and same and latency < 0.3,
                  "%s %.0f ms after the stop (the running task takes 1.5 s), "
                  "params %s" % (r.get("status"), 1000 * latency,
                                 "unchanged" if same else "CHANGED"))
        except Exception as exc:
            check("stop during the update", False, str(exc))

    failed = sum(1 for _, ok, _ in RESULTS if not ok)
    print("%d passed, %d failed" % (len(RESULTS) - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
