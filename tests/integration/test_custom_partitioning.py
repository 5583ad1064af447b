"""Ops defined with ``jax.experimental.custom_partitioning`` (jax's cuDNN fused attention on GPU,
``jax.nn.dot_product_attention(implementation="cudnn")``, is one). jax lowers such an op inline on
one partition but as a ``CustomSPMDPartitioning`` custom call on several: alpa_pass extracts the
module lowered for the plan's device count (``trace.lower``'s ``mesh``), so extraction and
emission see the same op (before: EmitError "the module changed between extraction and
emission"), and plans it by the ``sdy.sharding_rule`` jax attaches (``extract.op_table``)."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning

import alpa_pass as ap
from alpa_pass.tools.fidelity import list_collectives, summarize


@custom_partitioning
def _act(x):
    return jnp.tanh(x)


def _partition(mesh, arg_shapes, result_shape):
    sharding = arg_shapes[0].sharding
    return mesh, jnp.tanh, sharding, (sharding,)


_act.def_partition(partition=_partition, infer_sharding_from_operands=lambda mesh, args, res: args[0].sharding,
                   sharding_rule="i j -> i j")


def _forward(w, x):
    return _act(x @ w) @ w


def test_a_custom_partitioning_op_is_planned_by_its_rule_and_runs_per_shard():
    w = jax.random.normal(jax.random.key(0), (64, 64)) / 8
    x = jax.random.normal(jax.random.key(1), (32, 64))
    f = ap.parallelize(_forward, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=(2, 4))))
    exe = f.get_executable(w, x)
    assert exe.plan.fallbacks == {}  # (as a rule-less custom call it would be computed replicated)
    hlo = exe.hlo_text()
    counts = {k: v["count"] for k, v in summarize(list_collectives(hlo)).items() if v["count"]}
    assert counts == {}, counts  # the activation stays on the batch shard the plan gives it
    tanh_shapes = set(re.findall(r"= (f32\[[\d,]+\])\S* tanh\(", hlo))
    assert tanh_shapes == {"f32[4,64]"}, tanh_shapes  # 32 rows over 8 devices
    np.testing.assert_allclose(np.asarray(f(w, x)), np.asarray(jax.jit(_forward)(w, x)), rtol=1e-5, atol=1e-6)
