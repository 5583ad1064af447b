"""The no-op equations jax adds when a step is traced again under a mesh, folded away (part of
:mod:`alpa_pass._compat`: jaxpr internals, checked against the supported jax versions)."""
from __future__ import annotations

import jax

from alpa_pass._compat import scan_operands


def fold_retraced_mesh_ops(closed_jaxpr):
    """``closed_jaxpr`` without the no-op equations that jax adds when a step is traced again for
    arguments committed to a mesh (ours, after its first call); the same object when there are none.

    Such a trace runs under that abstract mesh, where jax makes
    - the constant ``1`` of ``tanh``'s and ``sigmoid``'s jvp as ``reshard 1.0`` (``lax._one``: a
      scalar on the mesh, replicated), which a scan body closing over it takes as one more
      constant: each such reshard is replaced by the literal, and scan constants that thereby
      became literals are moved into the scan's body;
    - a broadcasting multiply's operand of the result's shape (``dt * y`` in diffrax's
      ``ODETerm.prod``, vmapped) as ``reshape[sharding=P(None, ...)]`` to its own shape on an
      Auto-axes mesh, ``jax.jacrev``'s unravelled rows as ``convert_element_type`` to their
      own dtype (``_possible_downcast``), and the cotangent of a ``jax.vjp`` called with
      ``jnp.ones(())`` as ``reduce_sum[axes=()]`` (K-FAC's sampled-Fisher vjp): each such identity
      op is replaced by its operand.
    Either trace may pass a constant between nested jits where the other has it in place (silu in
    a scan body: the retrace made the jvp's ``1.0`` in a jit and passed it through the scan into
    silu's jvp; flax NNX's step passes a literal to a jit in both): a nested jit's literal results
    go to its caller and its literal operands into its body, in every trace.
    The same computation as the first trace, in a different program; folded, both traces lower to
    the same module (an LSTM's step, a diffrax neural ODE's, planned once)."""
    from jax.extend import core

    def fold(jaxpr):
        env, eqns, changed = {}, [], False
        for eqn in jaxpr.eqns:
            invars = [env.get(v, v) if isinstance(v, core.Var) else v for v in eqn.invars]
            if (eqn.primitive.name == "reshard" and len(invars) == 1 and isinstance(invars[0], core.Literal)
                    and eqn.outvars[0].aval.shape == ()):
                env[eqn.outvars[0]] = core.Literal(invars[0].val, eqn.outvars[0].aval)
                changed = True
                continue
            if _identity_op(eqn, invars):
                env[eqn.outvars[0]] = invars[0]
                changed = True
                continue
            params, inlined, outvars = eqn.params, None, list(eqn.outvars)
            if eqn.primitive.name == "scan" and any(isinstance(v, core.Literal) for v in invars):
                inlined = _inline_scan_literals(params, invars)
                if inlined is not None:
                    params, invars = inlined
            if eqn.primitive.name == "jit" and any(isinstance(v, core.Literal) for v in invars):
                inlined = params, invars = _inline_jit_literals(params, invars)
            params, sub_changed = _fold_params(params, fold)  # (after inlining: nested scans see them)
            if eqn.primitive.name == "jit":
                dropped = _drop_literal_results(params, outvars)
                if dropped is not None:
                    params, outvars, bound = dropped
                    env.update(bound)
            if inlined is not None or sub_changed or invars != list(eqn.invars) or outvars != list(eqn.outvars):
                eqn = eqn.replace(invars=invars, params=params, outvars=outvars)
                changed = True
            eqns.append(eqn)
        if not changed:
            return jaxpr, False
        outvars = [env.get(v, v) if isinstance(v, core.Var) else v for v in jaxpr.outvars]
        return jaxpr.replace(eqns=eqns, outvars=outvars), True

    jaxpr, changed = fold(closed_jaxpr.jaxpr)
    return closed_jaxpr.replace(jaxpr=jaxpr) if changed else closed_jaxpr


def _identity_op(eqn, invars) -> bool:
    """A ``reshape`` of a value to its own shape, a ``convert_element_type`` to its own dtype
    and weak type, or a ``reduce_sum`` over no axes, whose sharding, if any, names no mesh axis on
    a mesh whose axes are all Auto (it moves and changes nothing)."""
    from jax.extend import core

    name = eqn.primitive.name
    if name not in ("reshape", "convert_element_type", "reduce_sum") or len(invars) != 1 or \
            not isinstance(invars[0], core.Var):
        return False
    src, dst = invars[0].aval, eqn.outvars[0].aval
    if src.dtype != dst.dtype or src.shape != dst.shape or getattr(src, "weak_type", False) != getattr(
            dst, "weak_type", False):
        return False
    if name == "reshape" and (tuple(eqn.params.get("new_sizes", ())) != tuple(src.shape)
                              or eqn.params.get("dimensions") is not None):
        return False
    if name == "reduce_sum" and tuple(eqn.params.get("axes", (0,))) != ():
        return False
    sharding = eqn.params.get("sharding", eqn.params.get("out_sharding"))
    if sharding is None:
        return True
    spec, mesh = getattr(sharding, "spec", None), getattr(sharding, "mesh", None)
    if spec is None or mesh is None or any(entry is not None for entry in spec):
        return False
    return all(t == jax.sharding.AxisType.Auto for t in getattr(mesh, "axis_types", ()))


def _fold_params(params: dict, fold) -> tuple[dict, bool]:
    """``params`` with each sub-jaxpr (bare, closed, or a tuple of them: cond's branches) folded."""
    from jax.extend import core

    def one(x):
        if isinstance(x, core.ClosedJaxpr):
            inner, changed = fold(x.jaxpr)
            return (x.replace(jaxpr=inner) if changed else x), changed
        if isinstance(x, core.Jaxpr):
            return fold(x)
        return x, False

    out, changed = dict(params), False
    for k, v in params.items():
        if isinstance(v, tuple) and any(isinstance(b, (core.ClosedJaxpr, core.Jaxpr)) for b in v) and \
                all(b is None or isinstance(b, (core.ClosedJaxpr, core.Jaxpr)) for b in v):
            folded = [one(b) for b in v]
            if any(c for _, c in folded):
                # (a namedtuple stays one: custom_linear_solve reads ``jaxprs.solve``, and its
                # ``transpose_solve`` may be None)
                rebuilt = [b for b, _ in folded]
                out[k], changed = (type(v)._make(rebuilt) if hasattr(v, "_fields") else tuple(rebuilt)), True
        else:
            new, c = one(v)
            if c:
                out[k], changed = new, True
    return out, changed


def _inline_jit_literals(params: dict, invals: list):
    """(params, operands) of a nested jit with its literal operands substituted into its body and
    dropped from its operands (and from its per-operand shardings, layouts, donations)."""
    from jax.extend import core

    drop = [i for i, v in enumerate(invals) if isinstance(v, core.Literal)]
    closed = params["jaxpr"]
    out = dict(params, jaxpr=closed.replace(jaxpr=_substituted(closed.jaxpr, drop, invals)))
    for key in ("in_shardings", "in_layouts", "donated_invars"):
        if key in params:
            out[key] = tuple(x for i, x in enumerate(params[key]) if i not in drop)
    return out, [v for i, v in enumerate(invals) if i not in drop]


def _substituted(jaxpr, drop: list, values: list):
    """``jaxpr`` with its invars at positions ``drop`` replaced by ``values`` there, and removed."""
    from jax.extend import core

    sub = {jaxpr.invars[i]: values[i] for i in drop}
    eqns = [e.replace(invars=[sub.get(v, v) if isinstance(v, core.Var) else v for v in e.invars])
            for e in jaxpr.eqns]
    outvars = [sub.get(v, v) if isinstance(v, core.Var) else v for v in jaxpr.outvars]
    return jaxpr.replace(invars=[v for i, v in enumerate(jaxpr.invars) if i not in drop], eqns=eqns, outvars=outvars)


def _drop_literal_results(params: dict, outvars: list):
    """(params, outvars, {caller var: literal}) of a nested jit whose (folded) body returns
    literals: the caller reads those literals and the jit no longer returns them; or None."""
    from jax.extend import core

    closed = params["jaxpr"]
    inner = closed.jaxpr
    drop = [i for i, v in enumerate(inner.outvars) if isinstance(v, core.Literal)]
    if not drop:
        return None
    bound = {outvars[i]: inner.outvars[i] for i in drop}
    inner = inner.replace(outvars=[v for i, v in enumerate(inner.outvars) if i not in drop])
    out = dict(params, jaxpr=closed.replace(jaxpr=inner))
    for key in ("out_shardings", "out_layouts"):
        if key in params:
            out[key] = tuple(x for i, x in enumerate(params[key]) if i not in drop)
    return out, [v for i, v in enumerate(outvars) if i not in drop], bound


def _inline_scan_literals(params: dict, invals: list):
    """(params, operands) of a scan whose literal constants are substituted into its body and
    dropped from its operands, or None when it has none. jax < 0.12 counts the constants in
    ``num_consts`` and holds the body as a ClosedJaxpr; 0.12 describes the operand groups by a flat
    tree ``ft_in`` and holds a bare Jaxpr."""
    from jax.extend import core

    consts, carry, xs = scan_operands(params, invals)
    drop = [i for i, c in enumerate(consts) if isinstance(c, core.Literal)]
    if not drop:
        return None
    body = params["jaxpr"]
    inner = _substituted(getattr(body, "jaxpr", body), drop, consts)
    kept = [c for i, c in enumerate(consts) if i not in drop]
    out = dict(params, jaxpr=body.replace(jaxpr=inner) if isinstance(body, core.ClosedJaxpr) else inner)
    if "num_consts" in params:
        out["num_consts"] = len(kept)
        if "linear" in params:
            out["linear"] = tuple(v for i, v in enumerate(params["linear"]) if i not in drop)
    else:
        from jax._src import flattree

        _, carry_ft, xs_ft = params["ft_in"].unpack()
        out["ft_in"] = flattree.pack((flattree.nones(len(kept)), carry_ft, xs_ft))
    return out, kept + list(carry) + list(xs)
