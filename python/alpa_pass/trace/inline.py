"""Inline a jaxpr's nested ``jax.jit`` calls (chosen ones), so that passes which look at the top
level of a program (the peel of a scanned layer stack, the pipeline's apply split) also see what
a user wrote inside an inner ``jax.jit``. The result is re-traced from the same avals and binds the
same equations (at their source locations): it computes exactly what the original does."""
from __future__ import annotations

import jax
from jax.extend.core import ClosedJaxpr, Literal

from alpa_pass import _compat

CALLS = ("pjit", "jit", "closed_call", "core_call")


def call_body(eqn) -> ClosedJaxpr | None:
    """The called jaxpr of a call equation (``CALLS``) as a ClosedJaxpr, else None."""
    if eqn.primitive.name not in CALLS:
        return None
    inner = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
    if inner is None:
        return None
    return inner if isinstance(inner, ClosedJaxpr) else ClosedJaxpr(inner, ())


def unconstrained(eqn) -> bool:
    """Whether a call equation states no in/out shardings (inlining it drops nothing the user said)."""
    return all(_compat.is_unspecified(s) for key in ("in_shardings", "out_shardings")
               for s in eqn.params.get(key, ()))


def inline_calls(closed: ClosedJaxpr, should=lambda eqn: True) -> ClosedJaxpr:
    """``closed`` with every call equation for which ``should(eqn)`` holds replaced by its body,
    recursively (calls inside an inlined body are asked too); ``closed`` itself when none is."""
    if not _any_call(closed.jaxpr, should):
        return closed
    jaxpr = closed.jaxpr

    def run(*args):
        env = dict(zip(jaxpr.constvars, closed.consts))
        env.update(zip(jaxpr.invars, args))
        _eval(jaxpr.eqns, env, should)
        return [_read(env, v) for v in jaxpr.outvars]

    return jax.make_jaxpr(run)(*[jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type)
                                 for v in jaxpr.invars])


def bind_eqn(eqn, env: dict, invals: list) -> None:
    """Bind ``eqn``'s primitive on ``invals`` (at the user's source location), its outputs into ``env``."""
    subfuns, params = _compat.bind_params(eqn)
    with _compat.eqn_source(eqn):
        outs = eqn.primitive.bind(*subfuns, *invals, **params)
    env.update(zip(eqn.outvars, outs if eqn.primitive.multiple_results else [outs]))


def _any_call(jaxpr, should) -> bool:
    return any(call_body(e) is not None and should(e) for e in jaxpr.eqns)


def _read(env: dict, v):
    return v.val if isinstance(v, Literal) else env[v]


def _eval(eqns, env: dict, should) -> None:
    for eqn in eqns:
        body = call_body(eqn)
        if body is None or not should(eqn):
            bind_eqn(eqn, env, [_read(env, v) for v in eqn.invars])
            continue
        sub = dict(zip(body.jaxpr.constvars, body.consts))
        sub.update(zip(body.jaxpr.invars, [_read(env, v) for v in eqn.invars]))
        _eval(body.jaxpr.eqns, sub, should)
        env.update(zip(eqn.outvars, [_read(sub, v) for v in body.jaxpr.outvars]))
