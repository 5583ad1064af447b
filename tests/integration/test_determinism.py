"""A plan is a function of (program, mesh, options, versions), not of the machine's load: the same
step planned on an idle machine and beside CPU hogs (busy-loop processes, one per core) has the
same plan digest (``runtime.multiprocess.plan_digest``, what ranks of a job compare). Refinement
was the part bounded by wall time (issue 14: objective 85209 under load vs 58474): the MLP forces
it (an unmerged ILP small enough to finish within refine_node_limit), the GPT plans with the
default options ("auto": its unmerged ILP is over the size bound, so refinement is skipped). No
solve has a wall-clock limit by default (``solver_time_limit_s=None``; node limits bound them).
No assertion on wall time.
"""
from __future__ import annotations

import os
import subprocess
import sys

import jax
import pytest

import alpa_pass as ap
from alpa_pass.runtime.multiprocess import plan_digest
from zoo import default_optimizer, gpt, init_state, mlp

HOG_S = 300  # each hog exits by itself after this long, should the test die before killing it


def _hogs():
    code = f"import time\nend = time.time() + {HOG_S}\nwhile time.time() < end:\n    pass\n"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(os.cpu_count() or 2)]


def _step(model, config):
    optimizer = default_optimizer()
    step = model.make_train_step(optimizer) if model is mlp else model.make_train_step(optimizer, config)
    state = jax.eval_shape(lambda: init_state(model.init(jax.random.key(0), config), optimizer))
    batch = jax.eval_shape(lambda: model.make_batch(jax.random.key(1), config))
    return step, (state, batch)


@pytest.mark.parametrize("model,config,shape,refine", [
    pytest.param(mlp, mlp.Config(num_layers=3, hidden=64, batch=16), (2, 4), True, id="mlp3-2x4-refined"),
    pytest.param(gpt, gpt.Config(layers=2), (2, 4), "auto", id="gpt2-2x4"),
])
def test_plan_digest_is_the_same_with_the_cpu_busy(model, config, shape, refine):
    step, args = _step(model, config)
    option = ap.AutoShardingOption(refine_unmerged=refine)

    def plan():
        return ap.parallelize(step, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=shape), option=option)
                              ).plan(*args)

    quiet = plan()
    hogs = _hogs()
    try:
        busy = plan()
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert not quiet.refinement.get("time_limited") and not busy.refinement.get("time_limited")
    assert plan_digest(busy) == plan_digest(quiet)
    assert busy.objective == quiet.objective
