"""Per-call overhead of the JAX_PLUGINS=alpa_pass path against the same shardings written by hand.

One process, plugin enabled: a plain ``jax.jit(train_step)`` (planned by the plugin) and
``jax.jit(train_step, in_shardings=..., out_shardings=...)`` given, by hand, the shardings the plan
chose (user shardings: the plugin leaves that one alone). Both run the steady-state step of a small
MLP with Adam; rounds alternate between the two, and the median per-call time of each is compared.
The hand-written jit has no internal sharding constraints, so XLA may partition its interior
differently; the ratio covers dispatch and that difference. Target: ratio <= 1.05.
Writes JSON to benchmarks/results/. Not a test.

    python benchmarks/bench_dispatch.py [--hidden 256] [--layers 4] [--calls 200] [--rounds 7]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax  # noqa: E402  (the environment below is read at backend initialisation, not import)

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["JAX_PLUGINS"] = "alpa_pass"  # must be set before jax initialises its backend


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--calls", type=int, default=200, help="calls per timed round")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    return p.parse_args(argv)


def build(args):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    def loss_fn(params, x, y):
        for i, layer in enumerate(params):
            x = x @ layer["kernel"] + layer["bias"]
            x = jax.nn.relu(x) if i + 1 < len(params) else x
        return jnp.mean((x - y) ** 2)

    optimizer = optax.adam(1e-3)

    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    rng = np.random.default_rng(0)
    params = [{"kernel": jnp.asarray(rng.standard_normal((args.hidden, args.hidden), np.float32) * 0.05),
               "bias": jnp.zeros((args.hidden,), jnp.float32)} for _ in range(args.layers)]
    x = rng.standard_normal((args.batch, args.hidden), dtype=np.float32)
    y = rng.standard_normal((args.batch, args.hidden), dtype=np.float32)
    return train_step, (params, optimizer.init(params), x, y)


def time_round(step, state, x, y, calls):
    """Seconds per call of ``calls`` chained steps (outputs fed back), after the round's first call.

    Each call is waited for: queuing many 8-device steps on a few CPU cores can starve XLA's CPU
    collective rendezvous (it aborts after 40 s)."""
    state = jax.block_until_ready(step(*state, x, y)[:2])
    t = time.perf_counter()
    for _ in range(calls):
        *state, loss = step(*state, x, y)
        loss.block_until_ready()
    return (time.perf_counter() - t) / calls, tuple(state)


def main(argv=None):
    args = parse_args(argv)
    import alpa_pass.plugin as plugin

    train_step, (params, opt_state, x, y) = build(args)
    auto = jax.jit(train_step)
    auto_state = auto(params, opt_state, x, y)
    assert plugin.stats()["planned"] == 1, f"the plugin did not plan the step: {plugin.stats()}"
    (name, plan), = plugin.plans()
    in_sh = jax.tree.unflatten(jax.tree.structure((params, opt_state, x, y)),
                               list(plugin.entries()[0].in_shardings))
    out_sh = jax.tree.map(lambda a: a.sharding, auto_state)
    hand = jax.jit(train_step, in_shardings=in_sh, out_shardings=out_sh)
    hand_state = hand(*jax.device_put((params, opt_state), in_sh[:2]), x, y)
    auto_state, hand_state = auto_state[:2], hand_state[:2]
    times = {"plugin": [], "hand": []}
    for _ in range(args.rounds):
        t, auto_state = time_round(auto, auto_state, x, y, args.calls)
        times["plugin"].append(t)
        t, hand_state = time_round(hand, hand_state, x, y, args.calls)
        times["hand"].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["plugin"] / med["hand"]
    print(f"steady-state step ({args.layers} x {args.hidden}, batch {args.batch}, mesh "
          f"{'x'.join(map(str, plan.mesh.shape))}): plugin {med['plugin'] * 1e6:.1f} us, "
          f"hand-written shardings {med['hand'] * 1e6:.1f} us, ratio {ratio:.3f} (target <= 1.05)")
    print(f"plugin stats: {plugin.stats()}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"dispatch_L{args.layers}_H{args.hidden}_{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump({"args": vars(args), "seconds_per_call": times, "median": med, "ratio": ratio,
                   "stats": plugin.stats()}, f, indent=2)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
