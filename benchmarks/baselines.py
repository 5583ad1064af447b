"""Hand-written parallel plans with ``jax.sharding`` only (no alpa_pass), one per classic method.

  dp        data parallel: parameters and optimizer state replicated, batch split over all devices;
            XLA all-reduces the gradients.
  zero2     ZeRO-2: parameters replicated; gradients constrained to a sharded layout (the intent is a
            reduce-scatter), optimizer state and the update sharded, new parameters all-gathered.
  zero3     ZeRO-3 / FSDP: parameters and optimizer state sharded at rest; constrained to replicated
            inside the step (all-gather before use), gradients sharded as in ZeRO-2.
  megatron  Megatron-LM tensor parallelism over the last mesh axis (column/row-parallel attention
            and MLP, vocabulary-parallel embedding; MoE experts split their FFN dim) x data
            parallelism over the other axes.
  expert    expert parallelism (MoE): expert weights split on the expert dim over all devices (over
            the leading mesh axes whose product divides the expert count, when it is smaller), the
            rest replicated, batch split over all devices.

ZeRO shards a leaf on its first dim divisible by the device count (leaves with none stay
replicated). On CPU, XLA never forms a reduce-scatter from all-reduce + slice (see DESIGN.md), so
the compiled ZeRO HLO shows all-reduce where a GPU build shows reduce-scatter; the suites record
what the HLO actually contains.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

METHODS = ("dp", "zero2", "zero3", "megatron", "expert")


@dataclasses.dataclass(frozen=True)
class Baseline:
    """One hand-written plan.

    Attributes:
      name: a METHODS entry.
      state_specs: PartitionSpec pytree of ``(params, opt_state)`` (in and out of the step).
      batch_specs: PartitionSpec pytree of the batch.
      compute_param_specs: params are constrained to these before the forward (ZeRO-3), or None.
      grad_specs: gradients are constrained to these (ZeRO-2/3), or None.
    """

    name: str
    state_specs: object
    batch_specs: object
    compute_param_specs: object = None
    grad_specs: object = None


def make_baseline(method: str, state, batch, axis_names: tuple[str, ...], axis_sizes: tuple[int, ...],
                  dim_rule: Callable[[str], int | None] | None = None) -> Baseline:
    """The ``method`` plan for ``state = (params, opt_state)`` and ``batch`` on a mesh.

    Args:
      state, batch: pytrees of arrays or ShapeDtypeStructs.
      axis_names / axis_sizes: the mesh.
      dim_rule: for "megatron" / "expert", maps a leaf's ``jax.tree_util.keystr`` path to the dim
        the method splits (None = replicated); the models define ``megatron_dim`` / ``expert_dim``.
    Raises:
      ValueError: unknown method, a missing dim_rule, or a batch the data-parallel axes do not divide.
    """
    everything = tuple(axis_names)
    n = math.prod(axis_sizes)
    if method == "dp":
        return Baseline(method, _tree_specs(state, lambda path, shape: P()), _batch_specs(batch, everything, n))
    if method in ("zero2", "zero3"):
        sharded = _tree_specs(state, lambda path, shape: _zero_spec(shape, everything, n))
        replicated = _tree_specs(state[0], lambda path, shape: P())
        state_specs = (replicated, sharded[1]) if method == "zero2" else sharded
        return Baseline(method, state_specs, _batch_specs(batch, everything, n),
                        compute_param_specs=replicated if method == "zero3" else None,
                        grad_specs=sharded[0])
    if method not in ("megatron", "expert"):
        raise ValueError(f"unknown baseline method {method!r}; choose from {METHODS}")
    if dim_rule is None:
        raise ValueError(f"baseline {method!r} needs the model's dim_rule (megatron_dim / expert_dim)")
    if method == "megatron":
        tp_axis, dp_axes = axis_names[-1], tuple(axis_names[:-1])
        dp_size = math.prod(axis_sizes[:-1])
        specs = _tree_specs(state, lambda path, shape: _dim_spec(shape, dim_rule(path), tp_axis))
        return Baseline(method, specs, _batch_specs(batch, dp_axes, dp_size))
    specs = _tree_specs(state, lambda path, shape: _fitting_dim_spec(shape, dim_rule(path), axis_names, axis_sizes))
    return Baseline(method, specs, _batch_specs(batch, everything, n))


def make_train_step(loss_fn: Callable, optimizer: optax.GradientTransformation, baseline: Baseline, mesh):
    """``train_step(state, batch) -> (state, loss)`` with the baseline's sharding constraints.

    Without constraints (dp, megatron, expert) this is exactly ``zoo.train_step_for``.
    """
    def constrain(tree, specs):
        if specs is None:
            return tree
        return jax.lax.with_sharding_constraint(tree, jax.tree.map(lambda s: NamedSharding(mesh, s), specs))

    def train_step(state, batch):
        params, opt_state = state
        loss, grads = jax.value_and_grad(
            lambda p: loss_fn(constrain(p, baseline.compute_param_specs), batch))(params)
        grads = constrain(grads, baseline.grad_specs)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    return train_step


def jit_baseline(train_step, baseline: Baseline, mesh):
    """``jax.jit`` of the step with the baseline's in/out shardings (state donated, loss replicated)."""
    state_sh = _shardings(baseline.state_specs, mesh)
    in_sh = (state_sh, _shardings(baseline.batch_specs, mesh))
    return jax.jit(train_step, in_shardings=in_sh, out_shardings=(state_sh, NamedSharding(mesh, P())),
                   donate_argnums=(0,))


def flat_specs(baseline: Baseline) -> list:
    """One PartitionSpec per leaf of ``(state, batch)``, in ``jax.tree.leaves`` order."""
    return _leaves((baseline.state_specs, baseline.batch_specs))


def _leaves(specs) -> list:
    return jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P))


def _shardings(specs, mesh):
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def _tree_specs(tree, rule: Callable[[str, tuple[int, ...]], P]):
    return jax.tree_util.tree_map_with_path(lambda path, x: rule(jax.tree_util.keystr(path), tuple(x.shape)), tree)


def _batch_specs(batch, axes: tuple[str, ...], size: int):
    def spec(path, x):
        if not x.shape or x.shape[0] % size:
            raise ValueError(f"batch leaf {jax.tree_util.keystr(path)} {tuple(x.shape)}: dim 0 must be "
                             f"divisible by the {size} data-parallel devices ({axes})")
        return P(_entry(axes))

    return jax.tree_util.tree_map_with_path(spec, batch)


def _zero_spec(shape: tuple[int, ...], axes: tuple[str, ...], n: int) -> P:
    for dim, size in enumerate(shape):
        if size % n == 0:
            return P(*([None] * dim), _entry(axes))
    return P()


def _dim_spec(shape: tuple[int, ...], dim: int | None, axes) -> P:
    if dim is None or dim >= len(shape):
        return P()
    return P(*([None] * dim), _entry(axes))


def _fitting_dim_spec(shape: tuple[int, ...], dim: int | None, axis_names, axis_sizes) -> P:
    """Split ``dim`` over the leading mesh axes whose sizes' product divides it (all of them when
    the dim allows: 64 experts on 8x8; only "x" for 8 experts on 8x8, replicated over the rest)."""
    if dim is None or dim >= len(shape):
        return P()
    axes, product = [], 1
    for name, size in zip(axis_names, axis_sizes):
        if shape[dim] % (product * size):
            break
        axes.append(name)
        product *= size
    return _dim_spec(shape, dim, tuple(axes)) if axes else P()


def _entry(axes):
    if isinstance(axes, str):
        return axes
    return axes[0] if len(axes) == 1 else tuple(axes)
