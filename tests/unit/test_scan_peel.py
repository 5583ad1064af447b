"""``trace.scan_peel``: which scans are peeled (the reverse scan of a layer stack's backward pass
over a stacked float argument, at least ``MIN_LENGTH`` iterations) and that the peeled program
computes what the scan did."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from alpa_pass import _compat
from alpa_pass.trace.scan_peel import MIN_LENGTH, eval_closed, peel_layer_scans

D, B = 16, 8


def _layers(ws, x):
    return jnp.mean(lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0] ** 2)


def _args(layers):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((layers, D, D)).astype(np.float32) / 4,
            rng.standard_normal((B, D)).astype(np.float32))


def _scans(closed):
    return [_compat.scan_info(e)[:2] for e in closed.jaxpr.eqns if e.primitive.name == "scan"]


def test_the_backward_loop_of_a_layer_stack_runs_its_last_iteration_peeled():
    """Forward scan and its reverse backward scan over 5 stacked weights: the forward scan stays
    whole; the backward one loops over iterations 4..1 and runs iteration 0 (layer 0's backward)
    inlined, its weight gradient concatenated to the loop's; values equal jax.jit's, and layer 0's
    input gradient (x is not differentiated) is not computed at all (dead code removed)."""
    args = _args(5)
    closed = jax.make_jaxpr(jax.value_and_grad(_layers))(*args)
    assert _scans(closed) == [(5, False), (5, True)]
    peeled = peel_layer_scans(closed)
    assert _scans(peeled) == [(5, False), (4, True)]
    names = [e.primitive.name for e in peeled.jaxpr.eqns]
    assert names.count("concatenate") == 1 and names.count("dot_general") == 1  # layer 0's weight gradient
    assert peeled.in_avals == closed.in_avals and peeled.out_avals == closed.out_avals
    got = jax.jit(lambda *a: eval_closed(peeled, *a))(*args)
    want = jax.jit(jax.value_and_grad(_layers))(*args)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-7)


def test_scans_that_are_not_layer_stacks_are_left_alone():
    """Forward scans (a layer stack without its gradient, micro-batch accumulation, fori_loop),
    short backward loops (< MIN_LENGTH) and reverse loops over integer arguments: nothing to peel."""
    ws, x = _args(MIN_LENGTH - 1)
    assert peel_layer_scans(jax.make_jaxpr(jax.grad(_layers))(ws, x)) is None
    assert peel_layer_scans(jax.make_jaxpr(_layers)(*_args(5))) is None

    w = ws[0]

    def accumulate(w, batch):
        micro = batch.reshape(4, -1, D)
        return lax.scan(lambda g, xb: (g + jax.grad(lambda w: jnp.sum(jnp.tanh(xb @ w)))(w), None),
                        jnp.zeros_like(w), micro)[0]

    assert peel_layer_scans(jax.make_jaxpr(accumulate)(w, np.ones((4 * B, D), np.float32))) is None

    def over_tokens(table, tokens):
        return lax.scan(lambda h, t: (h + table[t].sum(), None), 0.0, tokens, reverse=True)[0]

    assert peel_layer_scans(jax.make_jaxpr(over_tokens)(w, np.zeros((6, 3), np.int32))) is None
    assert peel_layer_scans(jax.make_jaxpr(lambda w, x: lax.fori_loop(0, 6, lambda i, h: h @ w, x))(w, x)) is None


def test_the_peeled_program_keeps_the_argument_names_jax_writes_into_the_module():
    """Traced again, the peeled program named its arguments ``invals[k]``: plan labels and
    ALPA_PASS_REPORT showed that for hk.layer_stack and nnx.scan steps instead of
    ``params['blocks']['w']`` (s42). It carries the user's program's names and result paths."""
    ws, x = _args(5)
    step = lambda params, x: jax.value_and_grad(_layers)(params["blocks"], x)  # noqa: E731
    closed = jax.make_jaxpr(step)({"blocks": ws}, x)
    peeled = peel_layer_scans(closed)
    assert peeled.jaxpr.debug_info.arg_names == ("params['blocks']", "x") == closed.jaxpr.debug_info.arg_names
    assert peeled.jaxpr.debug_info.result_paths == closed.jaxpr.debug_info.result_paths
