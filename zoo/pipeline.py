"""The zoo's GPT and MLP for PipeshardParallel: ``alpa_pass.mark_pipeline_boundary()`` between
layers (after every GPT block but the last; after every hidden MLP layer), and train steps that take
gradients with ``alpa_pass.value_and_grad`` (the point where PipeshardParallel knows gradients are
complete). Without boundaries they compute exactly what ``zoo.gpt`` / ``zoo.mlp`` do.
"""
from __future__ import annotations

import jax
import numpy as np

import alpa_pass as ap
from zoo import gpt, mlp, train_step_for


def _boundary(boundaries: bool):
    return ap.mark_pipeline_boundary if boundaries else None


def make_mlp_loss(boundaries: bool = True):
    """``loss_fn(params, batch)`` of ``zoo.mlp`` with a boundary after every hidden layer."""
    return mlp.make_loss_fn(_boundary(boundaries))


mlp_loss = make_mlp_loss()


def make_gpt_loss(config: gpt.Config, boundaries: bool = True):
    """``loss_fn(params, batch)`` of ``zoo.gpt`` at ``config`` with a boundary after every block but the last."""
    return gpt.make_loss_fn(config.heads, _boundary(boundaries))


def make_heavy_layer_loss(reps=(1, 4, 1, 1)):
    """``loss_fn(params, batch)`` of tanh layers over ``params[i]["kernel"]``, layer ``i`` applying
    its kernel ``reps[i]`` times (the default: layer 1 has 4x the FLOPs of the others), a
    boundary after every layer: the case where automatic stages must give one layer more devices."""
    import jax.numpy as jnp

    def loss_fn(params, batch):
        x = batch["x"]
        for r, layer in zip(reps, params):
            for _ in range(r):
                x = jnp.tanh(x @ layer["kernel"])
            ap.mark_pipeline_boundary()
        return jnp.mean((x - batch["y"]) ** 2)

    return loss_fn


def make_step(loss_fn, optimizer):
    """``train_step(state, batch) -> (state, loss)`` of ``loss_fn``, gradients by ``alpa_pass.value_and_grad``."""
    return train_step_for(loss_fn, optimizer, ap.value_and_grad)


def train_and_save(step, state, batches, out: str, describe) -> None:
    """For the multi-process pipeline scripts (tests/scripts/mpi_pipeline*.py): run the
    parallelized ``step`` over ``batches`` (one plan: outputs fed back must not re-plan), then on
    rank 0 write ``out`` (.npz): ``losses``, ``process_count``, every rank's plan ``digests``, the
    final state leaves ``leaf_i`` (tree order) and the arrays ``describe(executable, state)``
    returns (a dict; called on every rank)."""
    from alpa_pass.runtime.multiprocess import gather_digests, global_to_host

    losses = []
    for batch in batches:
        state, loss = step(state, batch)
        losses.append(loss)
    exe = step.get_executable(state, batches[0])
    assert step.num_plans == 1, "outputs fed back must not re-plan"
    extra = describe(exe, state)
    digests = gather_digests(exe.plan.digest)
    losses = global_to_host(losses)
    leaves = global_to_host(jax.tree.leaves(state))
    if jax.process_index() == 0:
        np.savez(out, losses=np.array(losses), process_count=jax.process_count(), digests=np.array(digests),
                 **{k: np.array(v) for k, v in extra.items()}, **{f"leaf_{i}": x for i, x in enumerate(leaves)})
