"""_compat.fold_retraced_mesh_ops: a step traced again for arguments committed to a mesh lowers to
the same module as its first trace once the scalar reshards are folded (the plugin's key)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import jaxpr_as_fun
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from alpa_pass import _compat
from alpa_pass.trace.lower import canonical_text


def _rnn_grad(w, xs):
    def step(h, x):
        h = jnp.tanh(h @ w + x)

        def inner(c, _):  # a nested scan closing over the outer body's values
            return jax.nn.sigmoid(c) * h, None

        h, _ = jax.lax.scan(inner, h, None, length=2)
        return h, h

    return jax.lax.scan(step, jnp.zeros((8, 16)), xs)[1].sum()


def _lowered(closed, avals):
    return canonical_text(jax.jit(jaxpr_as_fun(closed)).lower(*avals).as_text(debug_info=False))


def test_a_trace_under_the_mesh_folds_to_the_first_trace():
    w, xs = jnp.ones((16, 16)) * 0.1, jnp.linspace(0, 1, 5 * 8 * 16).reshape(5, 8, 16)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
    g = jax.grad(_rnn_grad)
    first = jax.make_jaxpr(g)(w, xs)
    again = jax.make_jaxpr(g)(jax.device_put(w, NamedSharding(mesh, P(None, "y"))),
                              jax.device_put(xs, NamedSharding(mesh, P(None, "x"))))
    prims = _compat.jaxpr_primitive_names(again)
    assert "reshard" in prims  # what jax does today; without it the test has nothing to fold
    assert _compat.fold_retraced_mesh_ops(first) is first  # nothing to fold: the same object
    folded = _compat.fold_retraced_mesh_ops(again)
    assert "reshard" not in _compat.jaxpr_primitive_names(folded)
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (w, xs)]
    assert _lowered(again, avals) != _lowered(first, avals)
    assert _lowered(folded, avals) == _lowered(first, avals)
    want = g(w, xs)
    np.testing.assert_allclose(jaxpr_as_fun(folded)(w, xs)[0], want, rtol=1e-6)


def test_silu_in_a_scan_body_folds_to_the_first_trace():
    """``jax.nn.silu`` (a nested jit) in a scan body: traced again under the mesh, the jvp's ``1.0``
    is made by a reshard inside a jit outside the scan, returned from it, passed through the scan
    into silu's jvp jit: folded, it goes back into that jit's body (the plugin planned and compiled
    such a step twice, flax / Equinox SwiGLU stacks scanned over layers)."""
    def loss(w, x):
        return jnp.mean(jax.lax.scan(lambda h, wl: (jax.nn.silu(h @ wl), None), x, w)[0] ** 2)

    w, x = jnp.ones((2, 16, 16)) * 0.1, jnp.linspace(0, 1, 8 * 16).reshape(8, 16)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
    g = jax.grad(loss)
    first = jax.make_jaxpr(g)(w, x)
    again = jax.make_jaxpr(g)(jax.device_put(w, NamedSharding(mesh, P(None, None, "y"))),
                              jax.device_put(x, NamedSharding(mesh, P("x"))))
    folded = _compat.fold_retraced_mesh_ops(again)
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (w, x)]
    assert _lowered(again, avals) != _lowered(first, avals)
    assert _lowered(folded, avals) == _lowered(first, avals)
    np.testing.assert_allclose(jaxpr_as_fun(folded)(w, x)[0], g(w, x), rtol=1e-6)


@pytest.mark.parametrize("operand", ["value", "array constant"])
def test_other_reshards_are_kept(operand):
    """Only a reshard of a scalar literal is folded: one of a computed value or of a non-scalar
    constant says where that value lives."""
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
    x = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("x")))
    replicated = NamedSharding(mesh, P())

    def f(a):
        moved = a * 2 if operand == "value" else np.ones((8, 4), np.float32)
        return jax.sharding.reshard(moved, replicated) + a

    closed = jax.make_jaxpr(f)(x)
    assert "reshard" in _compat.jaxpr_primitive_names(closed)
    assert _compat.fold_retraced_mesh_ops(closed) is closed


def test_identity_reshapes_onto_the_mesh_fold_to_their_operand():
    """A trace under the mesh reshapes a value made without one (a constant, or a value of a loop
    body, as diffrax's vmapped ``dt * y``) to its own shape with the mesh's replicated sharding;
    the first trace has no such reshape. Folded, the two lower alike; a reshape that changes
    the shape stays."""
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
    v = jax.device_put(jnp.linspace(0, 1, 512).reshape(256, 2), NamedSharding(mesh, P()))

    def f(v):
        w = jnp.arange(512.0).reshape(256, 2)
        sharding = getattr(jax.typeof(v), "sharding", None)
        moved = jax.lax.reshape(w, (256, 2), out_sharding=sharding) if sharding is not None else w
        return moved * v

    def reshapes(closed):
        return sum(e.primitive.name == "reshape" for e in closed.jaxpr.eqns)

    again, first = jax.make_jaxpr(f)(v), jax.make_jaxpr(f)(np.asarray(v))
    if reshapes(again) <= reshapes(first):
        pytest.skip("this jax adds no reshape under the mesh")
    folded = _compat.fold_retraced_mesh_ops(again)
    assert reshapes(folded) == reshapes(first) == 1  # arange's (512,) -> (256, 2) stays
    avals = [jax.ShapeDtypeStruct((256, 2), jnp.float32)]
    assert _lowered(folded, avals) == _lowered(first, avals) != _lowered(again, avals)
    np.testing.assert_allclose(jaxpr_as_fun(folded)(v)[0], f(np.asarray(v)), rtol=1e-6)


def test_jacrevs_identity_converts_under_the_mesh_fold_away():
    """``jax.jacrev`` unravels its rows through ``_possible_downcast``: traced for arguments
    committed to a mesh, each row gets a ``convert_element_type`` to its own dtype (float32 ->
    float32, a sharding with no mesh axis); the first trace has none. A step with a Jacobian in
    its loss (a PINN's) was planned and compiled twice; folded, both traces lower alike."""
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
    w = jnp.linspace(-1, 1, 64 * 64).reshape(64, 64)
    x = np.linspace(0, 1, 8 * 64, dtype=np.float32).reshape(8, 64)  # the batch: uncommitted

    def loss(w, x):
        u = lambda w, xi: jnp.tanh(xi @ w).sum()  # noqa: E731
        return jnp.mean(jax.vmap(jax.jacrev(u, argnums=1), in_axes=(None, 0))(w, x) ** 2)

    g = jax.grad(loss)

    def converts(closed):
        return sum(e.primitive.name == "convert_element_type" for e in closed.jaxpr.eqns)

    first = jax.make_jaxpr(g)(w, x)
    again = jax.make_jaxpr(g)(jax.device_put(w, NamedSharding(mesh, P(None, "y"))), x)
    if converts(again) <= converts(first):
        pytest.skip("this jax adds no convert under the mesh")
    folded, first_folded = _compat.fold_retraced_mesh_ops(again), _compat.fold_retraced_mesh_ops(first)
    assert converts(folded) == converts(first_folded)  # (on jax 0.10 the first trace has no-op converts too)
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (w, x)]
    assert _lowered(folded, avals) == _lowered(first_folded, avals)
    assert _lowered(again, avals) != _lowered(first, avals)
    np.testing.assert_allclose(jaxpr_as_fun(folded)(w, x)[0], g(w, x), rtol=1e-6)
    # a convert that changes the dtype stays
    widen = jax.make_jaxpr(lambda a: a.astype(jnp.float16) * 2)(w)
    assert _compat.fold_retraced_mesh_ops(widen) is widen


def test_a_vjp_seeded_with_ones_folds_its_identity_reduce_sum():
    """``jax.vjp(f, z)[1](jnp.ones(()))`` (K-FAC's sampled Fisher): traced for an argument
    committed to a mesh, the scalar cotangent gets a ``reduce_sum`` over no axes that the first
    trace lacks; the step was planned and compiled twice. Folded, both traces lower alike; a
    reduce_sum over an axis stays."""
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
    w = jnp.linspace(-1, 1, 64 * 16).reshape(64, 16)
    x = np.linspace(0, 1, 128 * 64, dtype=np.float32).reshape(128, 64)

    def step(w, x):
        _, vjp = jax.vjp(lambda z: jax.nn.logsumexp(z, axis=-1).mean(), x @ w)
        (gz,) = vjp(jnp.ones(()))
        return jnp.sum(gz.T @ gz)

    def empty_sums(closed):
        return sum(e.primitive.name == "reduce_sum" and tuple(e.params["axes"]) == ()
                   for e in closed.jaxpr.eqns)

    first = jax.make_jaxpr(step)(w, x)
    again = jax.make_jaxpr(step)(jax.device_put(w, NamedSharding(mesh, P(None, "y"))), x)
    if empty_sums(again) <= empty_sums(first):
        pytest.skip("this jax adds no reduce_sum under the mesh")
    folded = _compat.fold_retraced_mesh_ops(again)
    assert empty_sums(folded) == 0
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (w, x)]
    assert _lowered(folded, avals) == _lowered(_compat.fold_retraced_mesh_ops(first), avals)
    assert _lowered(again, avals) != _lowered(first, avals)
    np.testing.assert_allclose(jaxpr_as_fun(folded)(w, x)[0], step(w, x), rtol=1e-6)
    total = jax.make_jaxpr(lambda a: a.sum(axis=0))(w)
    assert _compat.fold_retraced_mesh_ops(total) is total


def test_a_linear_solve_keeps_its_named_sub_programs():
    """jax.scipy.sparse.linalg.cg with a nonlinear matvec (a Gauss-Newton / Hessian-free step),
    traced again under the mesh: its ``custom_linear_solve`` holds its sub-programs in a named
    tuple (``jaxprs.solve``, ``transpose_solve`` may be None). Folded into a plain tuple, jax's
    lowering failed (AttributeError: 'tuple' object has no attribute 'solve') and the script died
    at the step's second call (s42)."""
    from jax.scipy.sparse.linalg import cg

    def step(w, x):
        f = lambda w: jnp.tanh(x @ w)  # noqa: E731
        g = jax.grad(lambda w: jnp.mean(f(w) ** 2))(w)
        d, _ = cg(lambda v: jax.jvp(f, (w,), (v,))[1].T @ x @ jnp.eye(16) / 32 + 0.1 * v, g, maxiter=3)
        return w - d

    w, x = jnp.ones((16, 16)) * 0.1, jnp.linspace(-1, 1, 32 * 16).reshape(32, 16)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
    again = jax.make_jaxpr(step)(jax.device_put(w, NamedSharding(mesh, P())),
                                 jax.device_put(x, NamedSharding(mesh, P("x"))))
    folded = _compat.fold_retraced_mesh_ops(again)
    assert folded is not again  # (the tanh's reshard 1.0 inside the solve's matvec was folded)
    solves = [e for e in folded.jaxpr.eqns if e.primitive.name == "custom_linear_solve"]
    assert solves and hasattr(solves[0].params["jaxprs"], "solve")
    np.testing.assert_allclose(jax.jit(jaxpr_as_fun(folded))(w, x)[0], step(w, x), rtol=1e-5)
