"""Gradient accumulation (issue 13): a ``lax.scan`` over micro-batches and Alpa's
``ShardParallel(num_micro_batches=k)``. The plans equal jax.jit; the gradient sums of a
data-parallel loop body are carried per shard and reduced once, after the loop
(``emit/accumulation.py``), and the planner costs them once (``extract/accumulators.py``)."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax

import alpa_pass as ap
from alpa_pass.errors import ShardingError
from alpa_pass.extract.stablehlo import extract_graph, parse_module
from tests import helpers

K, B, H = 4, 512, 64
OPT = optax.adam(1e-2)


def _loss(params, x, y):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] - y) ** 2)


def _update(params, opt_state, grads):
    updates, opt_state = OPT.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def plain_step(state, batch):
    params, opt_state = state
    loss, grads = jax.value_and_grad(_loss)(params, batch["x"], batch["y"])
    return _update(params, opt_state, grads), loss


def scan_step(state, batch):
    """What users write: the batch cut into K micro-batches, gradients summed by lax.scan."""
    params, opt_state = state
    micro = jax.tree.map(lambda a: a.reshape(K, -1, *a.shape[1:]), batch)

    def body(acc, mb):
        loss, grads = jax.value_and_grad(_loss)(params, mb["x"], mb["y"])
        return jax.tree.map(jnp.add, acc, (loss, grads)), None

    zeros = jax.tree.map(jnp.zeros_like, (jnp.zeros(()), params))
    loss, grads = lax.scan(body, zeros, micro)[0]
    return _update(params, opt_state, jax.tree.map(lambda g: g / K, grads)), loss / K


def marker_step(state, batch):
    """The same step for ShardParallel(num_micro_batches=K): alpa_pass builds the loop."""
    params, opt_state = state
    loss, grads = ap.value_and_grad(_loss)(params, batch["x"], batch["y"])
    return _update(params, opt_state, grads), loss


def _state_and_batch():
    rng = np.random.default_rng(0)
    params = {"w1": rng.standard_normal((H, H)).astype(np.float32) / np.sqrt(H),
              "b1": np.zeros(H, np.float32),
              "w2": rng.standard_normal((H, H)).astype(np.float32) / np.sqrt(H)}
    batch = {"x": rng.standard_normal((B, H)).astype(np.float32),
             "y": rng.standard_normal((B, H)).astype(np.float32)}
    return (params, OPT.init(params)), batch


def loop_collectives(hlo: str) -> tuple[int, int]:
    """(all-reduces + reduce-scatters inside while bodies, outside them) in compiled HLO text."""
    bodies = set(re.findall(r"body=(%[\w.\-]+)", hlo))
    inside = outside = 0
    for comp in re.split(r"\n(?=\S.*\{\n)", hlo):
        n = len(re.findall(r"\s(?:all-reduce|reduce-scatter)(?:-start)?\(", comp))
        if comp.split(" ")[0] in bodies:
            inside += n
        else:
            outside += n
    return inside, outside


def _weight_grad_collectives_in_loop(hlo: str) -> list[str]:
    """The result shapes of the all-reduces / reduce-scatters inside while bodies that sum a
    matrix (the step's only matrices are the two [H, H] weights' gradients and activations of a
    model-parallel plan, which these plans do not use)."""
    bodies = set(re.findall(r"body=(%[\w.\-]+)", hlo))
    out = []
    for comp in re.split(r"\n(?=\S.*\{\n)", hlo):
        if comp.split(" ")[0] in bodies:
            out += re.findall(r"= (.+?) (?:all-reduce|reduce-scatter)(?:-start)?\(", comp)
    return [s for s in out if re.search(r"f32\[\d+,\d+\]", s)]


def _assert_close(got, want):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)


def _trains_like_jit(step, ref_step, state, batch, steps):
    """``steps`` steps of ``step`` equal those of single-device ``jax.jit(ref_step)``."""
    ref = state
    for _ in range(steps):
        state, loss = step(state, batch)
        ref, ref_loss = jax.jit(ref_step)(ref, batch)
        _assert_close((state, loss), (ref, ref_loss))


def test_accumulated_dots_cost_once():
    """The two weight-gradient dots, the bias gradient's sum and the loss's sum (divided by a
    constant on the way) of the scan body, all summed into the carry, count their communication
    once; every other body op, and their compute, count the 4 trips."""
    state, batch = _state_and_batch()
    graph = extract_graph(parse_module(jax.jit(scan_step).lower(state, batch).as_text()))
    assert graph.weights is not None and graph.comm_weights is not None
    changed = np.nonzero(graph.comm_weights != graph.weights)[0]
    assert sorted((graph.op_names[v], graph.shape(int(v))) for v in changed) == [
        ("stablehlo.dot_general", (H, H)), ("stablehlo.dot_general", (H, H)),
        ("stablehlo.reduce", ()), ("stablehlo.reduce", (H,))]
    assert all(graph.weights[v] == K and graph.comm_weights[v] == 1.0 for v in changed)


@pytest.mark.parametrize("shape", [(1, 8), (2, 4)])
def test_scan_accumulation_reduces_after_the_loop(shape):
    """3 Adam steps of the hand-written scan accumulation equal jax.jit's; the plan splits the
    micro-batch, and the gradients (and the loss) are all-reduced once after the loop, not once
    per micro-batch. (A weight whose gradient the plan computes column-split has no partial sums
    to carry: w1's on 1x8.)"""
    state, batch = _state_and_batch()
    step = ap.parallelize(scan_step, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=shape)))
    exe = step.get_executable(state, batch)
    assert exe.plan.emit_report.accumulators >= 3  # w2's gradient, b1's, the loss (w1's: see below)
    hlo = exe.hlo_text()
    # nothing is summed across devices inside the loop; the sums are all-reduced after it (XLA
    # combines them into one tuple all-reduce). On main (e539fa6) these plans all-reduced
    # activations inside the loop (1x8: 1, 2x4: 2 per micro-batch).
    assert loop_collectives(hlo) == (0, 1)
    _trains_like_jit(step, scan_step, state, batch, 3)


def test_without_the_rewrite_the_sync_is_in_the_loop():
    """The same plan emitted into a module whose accumulators do not start at zero (so the rewrite
    does not apply) keeps the weight-gradient all-reduces inside the loop: the structure the
    rewrite removes is real."""
    state, batch = _state_and_batch()

    def offset_step(state, batch):
        params, opt_state = state
        micro = jax.tree.map(lambda a: a.reshape(K, -1, *a.shape[1:]), batch)

        def body(acc, mb):
            return jax.tree.map(jnp.add, acc, jax.grad(_loss)(params, mb["x"], mb["y"])), None

        grads = lax.scan(body, jax.tree.map(lambda p: jnp.full_like(p, 1e-3), params), micro)[0]
        return _update(params, opt_state, grads)

    step = ap.parallelize(offset_step, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=(1, 8))))
    exe = step.get_executable(state, batch)
    assert exe.plan.emit_report.accumulators == 0
    assert len(_weight_grad_collectives_in_loop(exe.hlo_text())) >= 1
    _assert_close(step(state, batch), jax.jit(offset_step)(state, batch))


@pytest.mark.parametrize("shape", [(1, 8), (2, 4)])
def test_num_micro_batches_equals_plain_step_and_scan(shape):
    """ShardParallel(num_micro_batches=4) around ap.value_and_grad: the same numbers as the
    plain whole-batch step under jax.jit (a batch-mean loss: averaging over micro-batches is
    exact), and the same loop structure as the hand-written scan (gradients reduced after it)."""
    state, batch = _state_and_batch()
    mesh = ap.LogicalMesh(shape=shape)
    step = ap.parallelize(marker_step, method=ap.ShardParallel(mesh=mesh, num_micro_batches=K))
    exe = step.get_executable(state, batch)
    scan_exe = ap.parallelize(scan_step, method=ap.ShardParallel(mesh=mesh)).get_executable(state, batch)
    assert exe.plan.emit_report.accumulators == scan_exe.plan.emit_report.accumulators >= 3
    assert loop_collectives(exe.hlo_text()) == loop_collectives(scan_exe.hlo_text()) == (0, 1)
    # the same communication (their compute differs by the accumulating adds of the markers' loop)
    assert helpers.communication(exe.plan) == pytest.approx(helpers.communication(scan_exe.plan), rel=1e-6)
    _trains_like_jit(step, plain_step, state, batch, 2)


def test_num_micro_batches_has_aux_and_errors():
    """aux combined as Alpa does (float scalars averaged, per-example values concatenated, in
    the batch's row order; micro-batches are strided);
    a batch the micro-batch count does not divide, and a bad count, are typed errors."""
    state, batch = _state_and_batch()

    def aux_loss(params, x, y):
        err = (jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"] - y) ** 2
        return jnp.mean(err), (jnp.max(err), err.sum(axis=1))

    def step(params, batch):
        (loss, (mx, per_example)), grads = ap.value_and_grad(aux_loss, has_aux=True)(params, batch["x"], batch["y"])
        return grads, loss, mx, per_example

    params = state[0]
    got = ap.parallelize(step, method=ap.ShardParallel(num_micro_batches=K))(params, batch)
    micro = [jax.tree.map(lambda a: a[i::K], batch) for i in range(K)]  # micro-batch i: rows i, i + K, ...
    parts = [jax.jit(lambda p, b: jax.value_and_grad(aux_loss, has_aux=True)(p, b["x"], b["y"]))(params, b)
             for b in micro]
    want = (jax.tree.map(lambda *g: sum(g) / K, *[p[1] for p in parts]),
            sum(p[0][0] for p in parts) / K, sum(p[0][1][0] for p in parts) / K,
            jnp.stack([p[0][1][1] for p in parts], axis=1).reshape(B))  # row j*K + i is micro i's row j
    _assert_close(got, want)
    odd = jax.tree.map(lambda a: a[:B - 4], batch)
    with pytest.raises(ShardingError, match="num_micro_batches=3"):
        ap.parallelize(step, method=ap.ShardParallel(num_micro_batches=3)).get_executable(params, odd)
    with pytest.raises(ValueError, match="num_micro_batches"):
        ap.ShardParallel(num_micro_batches=0)


@pytest.mark.parametrize("method", [ap.DataParallel, ap.ShardParallel])
def test_micro_batches_of_a_split_batch_stay_on_their_devices(method):
    """A batch split on axis 0 over the devices (DataParallel pins it so) is cut into strided
    micro-batches: every device accumulates over its own rows, and the step compiles to data
    parallelism's one gradient all-reduce after the loop, no gather of the batch. (Contiguous
    micro-batches put micro-batch i on a quarter of the devices: the plan gathered the batch.)"""
    state, batch = _state_and_batch()
    option = ap.AutoShardingOption(force_data_parallel=method is ap.ShardParallel)
    step = ap.parallelize(marker_step, method=method(mesh=ap.LogicalMesh((1, 8)), num_micro_batches=K, option=option))
    exe = step.get_executable(state, batch)
    counts = ap.util.count_communication_primitives(exe.hlo_text(), ignore_scalar_all_reduce=True)
    assert counts == (1, 1, 0, 0, 0) and loop_collectives(exe.hlo_text())[0] == 0, counts
    assert exe.input_shardings[-1].spec[0] == ("x", "y") or exe.input_shardings[-1].spec[0] == "y"
    whole = ap.parallelize(plain_step, method=ap.DataParallel(mesh=ap.LogicalMesh((1, 8)))).get_executable(state, batch)
    # the same communication (the micro-batched step also computes its accumulating adds)
    assert helpers.communication(exe.plan) == pytest.approx(helpers.communication(whole.plan), rel=1e-6)
    _trains_like_jit(step, plain_step, state, batch, 2)


def test_an_lstms_fused_gate_gradients_are_reduced_after_the_time_loop():
    """flax's ``nn.RNN(nn.OptimizedLSTMCell)``: the cell concatenates its 4 gates' kernels, so the
    backward time loop sums one fused weight-gradient dot (and one bias sum) per step and slices it
    into the 12 gate parameters' accumulators. Split over the batch, the partial sums are carried
    per shard and all-reduced once after the loop (was: 2 all-reduces, an all-gather and 3
    all-to-alls per time step on 1x8 (60 steps), a plan objective of 1.28e6 against 9.4e4 now
    under unit costs, 7x slower than with this rewrite)."""
    import flax.linen as nn

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(4)(nn.RNN(nn.OptimizedLSTMCell(24))(x))

    model, opt = Model(), optax.adam(1e-3)
    x = np.random.default_rng(0).standard_normal((16, 12, 10)).astype(np.float32)
    params = model.init(jax.random.key(0), x)

    def step(state, x):
        params, opt_state = state
        loss, grads = jax.value_and_grad(lambda p: jnp.mean(model.apply(p, x) ** 2))(params)
        updates, opt_state = opt.update(grads, opt_state)
        return (optax.apply_updates(params, updates), opt_state), loss

    state = (params, opt.init(params))
    graph = extract_graph(parse_module(jax.jit(step).lower(state, x).as_text()))
    changed = np.nonzero(graph.comm_weights != graph.weights)[0]
    # the fused input-kernel and hidden-kernel gradient dots and the bias sum, costed once
    assert sorted((graph.op_names[v], graph.shape(int(v))) for v in changed) == [
        ("stablehlo.dot_general", (96, 10)), ("stablehlo.dot_general", (96, 24)), ("stablehlo.reduce", (96,))]
    par = ap.parallelize(step, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=(1, 8))))
    exe = par.get_executable(state, x)
    assert exe.plan.emit_report.accumulators == 12
    assert loop_collectives(exe.hlo_text()) == (0, 1)
    _trains_like_jit(par, step, state, x, 2)


def test_an_rk4_steps_stage_gradients_are_reduced_after_the_time_loop():
    """A neural ODE trained through an RK4 scan: the backward time loop adds each weight's four stage
    gradients into its accumulator in turn (``acc + d1 + d2 + d3 + d4``). All 12 dots are costed once
    and carried per shard, so the batch split needs no collective in the loop (was: a mixed plan,
    objective 5.3e6 against 2.4e5 now, 6x slower than one device in x64 on 1x8)."""
    rng = np.random.default_rng(0)
    b, h, steps, dt = 64, 64, 12, 0.05
    params = {"w1": rng.normal(size=(2, h)).astype(np.float32) / 1.4,
              "w2": rng.normal(size=(h, h)).astype(np.float32) / 8,
              "w3": rng.normal(size=(h, 2)).astype(np.float32) / 8}
    y0 = rng.normal(size=(b, 2)).astype(np.float32)
    target = rng.normal(size=(steps, b, 2)).astype(np.float32)

    def f(p, y):
        return jnp.tanh(jnp.tanh(y @ p["w1"]) @ p["w2"]) @ p["w3"]

    def loss_fn(p, y0, target):
        def rk4(y, _):
            k1 = f(p, y)
            k2 = f(p, y + dt / 2 * k1)
            k3 = f(p, y + dt / 2 * k2)
            k4 = f(p, y + dt * k3)
            y = y + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
            return y, y
        return jnp.mean((lax.scan(rk4, y0, None, length=steps)[1] - target) ** 2)

    def step(state, data):
        params, opt_state = state
        loss, grads = jax.value_and_grad(loss_fn)(params, *data)
        return _update(params, opt_state, grads), loss

    state = (params, OPT.init(params))
    graph = extract_graph(parse_module(jax.jit(step).lower(state, (y0, target)).as_text()))
    changed = np.nonzero(graph.comm_weights != graph.weights)[0]
    assert sorted(graph.shape(int(v)) for v in changed) == [(2, 64)] * 4 + [(64, 2)] * 4 + [(64, 64)] * 4
    assert {graph.op_names[v] for v in changed} == {"stablehlo.dot_general"}
    par = ap.parallelize(step, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=(1, 8))))
    exe = par.get_executable(state, (y0, target))
    assert exe.plan.emit_report.accumulators == 3
    assert loop_collectives(exe.hlo_text()) == (0, 1)
    _trains_like_jit(par, step, state, (y0, target), 2)
