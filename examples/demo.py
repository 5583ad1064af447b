"""Demo: auto-shard a small GPT training step over 8 simulated CPU devices.

Prints the plan, then a table of the losses per step next to plain ``jax.jit`` on one device, and
exits with status 1 if they differ by more than 1e-4.

    python examples/demo.py [--steps 5] [--mesh 2x4] [--layers 2] [--hidden 64]
"""
from __future__ import annotations

import argparse
import os
import sys

_DEVICES_FLAG = "--xla_force_host_platform_device_count=8"
if _DEVICES_FLAG.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _DEVICES_FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # for zoo

import jax  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import alpa_pass as ap  # noqa: E402
from zoo import default_optimizer, gpt, init_state  # noqa: E402

TOLERANCE = 1e-4


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--mesh", default="2x4", help="logical mesh shape, e.g. 2x4 or 1x8")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    return p.parse_args(argv)


def single_device_losses(train_step, state, batches) -> list[float]:
    """Losses of plain jax.jit on jax.devices()[0]."""
    dev = jax.devices()[0]
    step = jax.jit(train_step)
    state, losses = jax.device_put(state, dev), []
    for batch in batches:
        state, loss = step(state, jax.device_put(batch, dev))
        losses.append(float(loss))
    return losses


def main(argv=None) -> int:
    args = parse_args(argv)
    jax.config.update("jax_default_matmul_precision", "highest")
    console = Console()
    config = gpt.Config(vocab=args.vocab, seq=args.seq, hidden=args.hidden, heads=args.heads,
                        layers=args.layers, batch=args.batch)
    optimizer = default_optimizer()
    train_step = gpt.make_train_step(optimizer, config)
    state = init_state(gpt.init(jax.random.key(0), config), optimizer)
    batches = [gpt.make_batch(jax.random.key(1), config)] * args.steps  # one batch: loss must fall
    reference = single_device_losses(train_step, state, batches)

    mesh = ap.LogicalMesh(shape=tuple(int(s) for s in args.mesh.split("x")))
    step = ap.parallelize(train_step, method=ap.ShardParallel(mesh=mesh, option=ap.AutoShardingOption()),
                          donate_argnums=(0,))
    exe = step.get_executable(state, batches[0])
    print(exe.plan.summary())

    losses = []
    for batch in batches:
        state, loss = step(state, batch)
        losses.append(float(loss))

    table = Table(title=f"GPT ({args.layers} layers, hidden {args.hidden}) on mesh {args.mesh}")
    for col in ("step", "loss (alpa_pass)", "loss (1 device)", "|difference|"):
        table.add_column(col, justify="right")
    worst = 0.0
    for i, (got, want) in enumerate(zip(losses, reference)):
        worst = max(worst, abs(got - want))
        table.add_row(str(i), f"{got:.7f}", f"{want:.7f}", f"{abs(got - want):.2e}")
    console.print(table)
    if worst > TOLERANCE:
        console.print(f"[red]FAIL: losses differ by {worst:.3e} > {TOLERANCE}[/red]")
        return 1
    console.print(f"[green]OK: losses agree within {TOLERANCE} (worst {worst:.2e})[/green]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
