"""apply_sites: which stage (or CROSS / FREE) each optimizer equation runs on, and in which phase."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from alpa_pass.pipeline.programs.apply_sites import CROSS, FREE, assign_sites


def _sites(fn, *shapes, seeds):
    """Sites of ``fn``'s jaxpr with input ``i`` seeded on ``seeds[i]`` (None: unseeded)."""
    jaxpr = jax.make_jaxpr(fn)(*[jnp.zeros(s) for s in shapes]).jaxpr
    seeded = {v: s for v, s in zip(jaxpr.invars, seeds) if s is not None}
    return jaxpr, assign_sites(jaxpr.eqns, seeded)


def momentum(p0, g0, p1, g1, mu0, mu1, count):
    """Two parameters on two stages, their momentum, a shared step counter."""
    lr = 0.1 / (1.0 + count)
    mu0 = 0.9 * mu0 + g0
    mu1 = 0.9 * mu1 + g1
    return p0 - lr * mu0, p1 - lr * mu1, mu0, mu1, count + 1


def test_optimizer_state_follows_its_parameter_and_the_counter_is_free():
    s = (4, 4)
    jaxpr, sites = _sites(momentum, s, s, (8,), (8,), s, (8,), (), seeds=[0, 0, 1, 1, None, None, None])
    mu0, mu1, count = jaxpr.invars[4:]
    assert sites.site(mu0) == 0 and sites.site(mu1) == 1
    assert sites.site(count) == FREE
    new_p0, new_p1, new_mu0, new_mu1, new_count = jaxpr.outvars
    assert [sites.site(v) for v in (new_p0, new_mu0, new_p1, new_mu1)] == [0, 0, 1, 1]
    assert sites.site(new_count) == FREE
    assert CROSS not in sites.eqn_site and set(sites.eqn_phase) == {0}


def clipped(p0, g0, p1, g1):
    """Global-norm clipping of two stages' gradients."""
    norm = jnp.sqrt(jnp.sum(g0 ** 2) + jnp.sum(g1 ** 2))
    scale = jnp.minimum(1.0, 1.0 / norm)
    return p0 - g0 * scale, p1 - g1 * scale, norm


def test_global_norm_is_cross_and_only_scalars_cross_stages():
    jaxpr, sites = _sites(clipped, (4, 4), (4, 4), (8,), (8,), seeds=[0, 0, 1, 1])
    cross = [e for e, s in zip(jaxpr.eqns, sites.eqn_site) if s == CROSS]
    assert cross, "the sum of the two stages' partial sums is cross-stage"
    assert all(v.aval.shape == () for e in cross for v in e.invars if hasattr(v, "aval"))
    new_p0, new_p1, norm = jaxpr.outvars
    assert sites.site(new_p0) == 0 and sites.site(new_p1) == 1 and sites.site(norm) == CROSS
    assert sites.var_phase[new_p0] == 1 and sites.var_phase[new_p1] == 1, "updates wait for the norm"
    partial_phases = {p for e, s, p in zip(jaxpr.eqns, sites.eqn_site, sites.eqn_phase)
                      if s in (0, 1) and e.primitive.name == "reduce_sum"}
    assert partial_phases == {0}


def test_chain_of_partial_sums_stays_in_the_cross_region():
    def chained(a0, b1, c0, d1):
        total = jnp.sum(a0) + jnp.sum(b1)  # cross
        total = total + jnp.sum(c0)        # stage 0's scalar joins the cross sum
        total = total + jnp.sum(d1)
        return a0 * total, b1 * total

    jaxpr, sites = _sites(chained, (4,), (4,), (4,), (4,), seeds=[0, 1, 0, 1])
    adds = [s for e, s in zip(jaxpr.eqns, sites.eqn_site) if e.primitive.name == "add"]
    assert adds == [CROSS, CROSS, CROSS]
    assert [sites.site(v) for v in jaxpr.outvars] == [0, 1]


def test_jitted_helpers_are_inlined_so_each_stage_keeps_its_own_update():
    """A jitted optimizer helper over several stages' leaves (optax's tree_bias_correction is a
    ``jit`` equation on jax >= 0.11) is inlined: its per-leaf equations land on their own stages."""
    import numpy as np
    from jax.extend.core import jaxpr_as_fun

    from alpa_pass.pipeline.trace.step import inline_calls

    correct = jax.jit(lambda mus, count: [m / (1.0 - 0.9 ** count) for m in mus])

    def step(p0, p1, g0, g1, mu0, mu1, count):
        m0, m1 = correct([0.9 * mu0 + g0, 0.9 * mu1 + g1], count)
        return p0 - jax.jit(lambda m: 0.1 * m)(m0), p1 - 0.1 * m1

    args = [jnp.arange(3.0), jnp.arange(4.0), jnp.ones(3), jnp.ones(4), jnp.ones(3), 2 * jnp.ones(4),
            jnp.float32(2)]
    closed = jax.make_jaxpr(step)(*args)
    assert any(e.primitive.name in ("pjit", "jit") for e in closed.jaxpr.eqns)
    flat = inline_calls(closed)
    assert not any(e.primitive.name in ("pjit", "jit") for e in flat.jaxpr.eqns)
    for want, got in zip(jaxpr_as_fun(closed)(*args), jaxpr_as_fun(flat)(*args)):
        np.testing.assert_array_equal(got, want)
    def sites_of(jaxpr):
        stage_of = dict(zip(jaxpr.invars, [0, 1, 0, 1, None, None, None]))
        return assign_sites(jaxpr.eqns, {v: s for v, s in stage_of.items() if s is not None})

    assert CROSS in sites_of(closed.jaxpr).eqn_site  # the helper mixes both stages' values
    sites = sites_of(flat.jaxpr)
    assert CROSS not in sites.eqn_site and {0, 1} <= set(sites.eqn_site)
    assert [sites.var_site[v] for v in flat.jaxpr.outvars] == [0, 1]
