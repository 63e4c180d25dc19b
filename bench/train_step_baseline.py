# SPDX-License-Identifier: Apache-2.0
"""The two baselines of bench/train_step, each a long-lived child driven by
the bench over stdin/stdout (one line each way):

    bench -> child   "go N"   run N calls, answer "rate <tokens/s> <CPU
                              seconds per call, all threads>"
                     "quit"   answer "rss <peak RSS in KiB>" and exit
    child -> bench   "ready <loss of step 1> <loss of step K>" once warm

usage: train_step_baseline.py iree|jax DIR K LR [IREE_FLAG...]

DIR holds what the bench wrote: train.vmfb (@train_steps of the model with
K fused steps), params/NNN.npy (initial f32 parameters in argument order),
ids.npy and targets.npy ([K, B, T] int32) and table.json (`pcp model
--params-json`).

iree: the same VMFB in a tight `iree.runtime` loop (params, m and v as
      resident DeviceArrays fed back each call; ids and targets from NumPy;
      losses to the host), as tight as the Python binding allows. IREE_FLAGs
      (runtime flags such as --task_topology_group_count=2) are parsed
      before the device is created.
jax:  the same model (tests/models/jax_reference.py, written independently
      of the emitter), loss + jax.grad + the same AdamW with global-norm
      clipping, K steps fused with lax.scan under one jax.jit (the K
      rates scanned with the data, as pcp's lr vector is), the state
      donated so XLA updates it in place; warmed up (compiled) first.
"""
import glob
import json
import os
import resource
import sys
import time

import numpy as np

# AdamW as `pcp compile --program train` emits it by default
# (pcp_compile_training_options_initialize).
B1, B2, EPS, WD, CLIP = 0.9, 0.999, 1e-8, 0.01, 1.0


def load(directory):
    params = [np.load(f) for f in
              sorted(glob.glob(os.path.join(directory, "params", "*.npy")))]
    ids = np.load(os.path.join(directory, "ids.npy"))
    targets = np.load(os.path.join(directory, "targets.npy"))
    return params, ids, targets


def iree_side(directory, k, lr, flags):
    import iree.runtime as rt
    if flags:
        rt.flags.parse_flags(*flags)
    params, ids, targets = load(directory)
    config = rt.Config("local-task")
    ctx = rt.SystemContext(config=config)
    with open(os.path.join(directory, "train.vmfb"), "rb") as f:
        vm = rt.VmModule.copy_buffer(ctx.instance, f.read())
    ctx.add_vm_module(vm)
    train_steps = ctx.modules[vm.name]["train_steps"]
    dev = config.device
    n = len(params)
    state = ([rt.asdevicearray(dev, p) for p in params] +
             [rt.asdevicearray(dev, np.zeros_like(p)) for p in params] +
             [rt.asdevicearray(dev, np.zeros_like(p)) for p in params])
    lr = np.full((k,), lr, np.float32)  # one rate per fused step
    step = [1.0]

    def call():
        nonlocal state
        out = train_steps(*state, np.float32(step[0]), lr, ids, targets)
        state = list(out[:3 * n])
        step[0] += k
        return out[3 * n + 1].to_host()  # after the state and step + k

    return call


def jax_side(directory, k, lr, flags):
    import jax
    import jax.numpy as jnp
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "tests", "models"))
    import jax_reference as ref
    params, ids, targets = load(directory)
    with open(os.path.join(directory, "table.json")) as f:
        table = json.load(f)
    loss_fn = ref.loss_fn(table)

    def one_step(carry, data):
        p, m, v, t = carry
        rate = data[2]  # this step's rate, as pcp's lr[i]
        loss, g = jax.value_and_grad(loss_fn)(p, data[0], data[1])
        norm = jnp.sqrt(sum(jnp.sum(x * x) for x in g))
        scale = CLIP / jnp.maximum(norm, CLIP)
        out_p, out_m, out_v = [], [], []
        for pi, gi, mi, vi in zip(p, g, m, v):
            gi = gi * scale
            mi = B1 * mi + (1 - B1) * gi
            vi = B2 * vi + (1 - B2) * gi * gi
            m_hat = mi / (1 - B1 ** t)
            v_hat = vi / (1 - B2 ** t)
            out_p.append(pi - rate * (m_hat / (jnp.sqrt(v_hat) + EPS) + WD * pi))
            out_m.append(mi)
            out_v.append(vi)
        return (out_p, out_m, out_v, t + 1), loss

    def train_steps(p, m, v, t, ids, targets, rates):
        (p, m, v, t), losses = jax.lax.scan(one_step, (p, m, v, t),
                                            (ids, targets, rates))
        return p, m, v, t, losses

    train_steps = jax.jit(train_steps, donate_argnums=(0, 1, 2))
    state = ([jnp.asarray(p) for p in params],
             [jnp.zeros_like(p) for p in params],
             [jnp.zeros_like(p) for p in params], jnp.float32(1))
    jids, jtargets = jnp.asarray(ids), jnp.asarray(targets)
    rates = jnp.full((k,), lr, jnp.float32)

    def call():
        nonlocal state
        p, m, v, t, losses = train_steps(*state, jids, jtargets, rates)
        state = (p, m, v, t)
        return np.asarray(losses)

    return call


def main():
    side, directory, k, lr = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
        float(sys.argv[4])
    call = {"iree": iree_side, "jax": jax_side}[side](directory, k, lr,
                                                      sys.argv[5:])
    losses = call()  # warm-up (and JAX's compile)
    batch, block = np.load(os.path.join(directory, "ids.npy")).shape[1:]
    tokens = k * batch * block
    print("ready %.6f %.6f" % (losses[0], losses[-1]), flush=True)
    for line in sys.stdin:
        words = line.split()
        if words[0] == "go":
            calls = int(words[1])
            cpu = time.process_time()
            start = time.perf_counter()
            for _ in range(calls):
                call()
            rate = calls * tokens / (time.perf_counter() - start)
            print("rate %.3f %.6f" % (rate, (time.process_time() - cpu) / calls),
                  flush=True)
        elif words[0] == "quit":
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            print("rss %d" % rss, flush=True)
            return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
