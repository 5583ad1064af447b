"""Peel the last iteration of a scanned layer stack's backward loop: run it outside the loop.

A loop-carried value has ONE layout in the plan (the while's init, body argument, yield and result
are tied: issue 13). The backward pass of a scanned layer stack (the reverse scan JAX's transpose
makes of a forward ``lax.scan`` / ``nn.scan``, ``nn.remat`` included) carries the activation
gradient; its last iteration is layer 0's backward, which hands that gradient to the embedding
gradient. In the loop it must yield it in the loop's layout, so it is all-gathered there (every
iteration is), where an unrolled twin's layer 0 hands it over split with a cheap all-to-all.
:func:`peel_layer_scans` rewrites such a scan ``scan(body, length=L, reverse=True)`` into

    scan(body, length=L-1, reverse=True) over xs[1:], then body(iteration 0)

so the planner gives layer 0's backward its own layouts and the loop one layout. The inlined
iteration runs the scan's own body equations (the same ops: numerics equal); the ``ys`` are
``concat([ys_0[None], ys_1..L-1])``.

Only that iteration, measured on the test GPT (``tests/integration/test_scan_layers.py``, lax):
peeling the forward scan's first and last iterations gains nothing (1x8: 995510 as unpeeled,
against 973562 with this peel) and made the merged-follower ILP's optimum on 2x4 worse (776254
-> 820796) and the 24-layer 8x8 solve 5x slower; peeling the backward loop's first iteration as
well changes nothing (973563, 776260). Only the refined (unmerged) flax_remat plan on 2x4 gained
from the extra copies (800893 -> 797328, 0.4%).

Which scans (the rule, :func:`is_layer_stack`): a reverse ``scan`` at the top level of the
function (not inside a ``cond`` or another loop) with at least :data:`MIN_LENGTH` iterations
that walks over a floating-point argument of the function as it was passed (the stacked
``[L, ...]`` parameters). A scan inside a nested ``jax.jit`` (a jitted loss, ``jax.jit(model.apply)``,
jax's own transposed call) counts too when the arguments it walks over are passed straight
through, and that call states no shardings: such calls are inlined first (``trace.inline``).
Forward scans (gradient accumulation over micro-batches, a forward layer stack, ``fori_loop``)
and short loops are left alone.

Cost: one more copy of the backward loop body in the module, in the ILP (about +60% columns on
the 24-layer 8x8 benchmark GPT, planning 4 -> 8 s at 24 layers, 4 -> 9 s at 48) and in XLA's compile; the copy is a
constant, not growing with the layer count. ``AutoShardingOption.peel_layer_scans=False`` turns
it off.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import ClosedJaxpr, Literal

from alpa_pass import _compat
from alpa_pass.trace.inline import bind_eqn, call_body, inline_calls, unconstrained

MIN_LENGTH = 3  # fewer iterations: a loop of one body left, hardly a layer stack


def is_layer_stack(eqn, args: set) -> bool:
    """Whether the top-level equation ``eqn`` is a scan to peel (see the module docstring);
    ``args``: the function's argument variables."""
    if eqn.primitive.name != "scan":
        return False
    length, reverse, _ = _compat.scan_info(eqn)
    if not reverse or length < MIN_LENGTH:
        return False
    _, _, xs = _compat.scan_operands(eqn.params, list(eqn.invars))
    return any(not isinstance(v, Literal) and v in args and jnp.issubdtype(v.aval.dtype, jnp.floating)
               for v in xs)


def has_layer_stack(jaxpr) -> bool:
    """Whether the (open) jaxpr ``jaxpr`` has a scan :func:`peel_layer_scans` would peel (at its
    top level or inside a call it would inline)."""
    args = set(jaxpr.invars)
    return any(is_layer_stack(e, args) or _holds_stack(e, args) for e in jaxpr.eqns)


def _holds_stack(eqn, args: set) -> bool:
    """Whether ``eqn`` is an unconstrained call whose body (or a call in it, at any depth) has a
    layer stack over values that are the outer function's arguments passed straight in."""
    body = call_body(eqn)
    if body is None or not unconstrained(eqn):
        return False
    inner = {w for v, w in zip(eqn.invars, body.jaxpr.invars) if not isinstance(v, Literal) and v in args}
    return bool(inner) and any(is_layer_stack(e, inner) or _holds_stack(e, inner) for e in body.jaxpr.eqns)


def _may_hold_stack(eqn) -> bool:
    """Whether ``eqn`` is an unconstrained call with a long reverse scan at the top level of its
    body or of a call in it (inlined: which of them are layer stacks is decided after)."""
    body = call_body(eqn)
    if body is None or not unconstrained(eqn):
        return False
    return any((e.primitive.name == "scan" and _compat.scan_info(e)[1] and _compat.scan_info(e)[0] >= MIN_LENGTH)
               or _may_hold_stack(e) for e in body.jaxpr.eqns)


def peel_layer_scans(closed: ClosedJaxpr) -> ClosedJaxpr | None:
    """``closed`` with every layer-stack scan (:func:`is_layer_stack`) peeled, or None when it has
    none (nothing to rewrite). Calls holding one are inlined first."""
    original, args = closed, set(closed.jaxpr.invars)
    if any(_holds_stack(e, args) for e in closed.jaxpr.eqns):
        closed = inline_calls(closed, should=_may_hold_stack)
    jaxpr = closed.jaxpr
    args = set(jaxpr.invars)
    stacks = {id(e) for e in jaxpr.eqns if is_layer_stack(e, args)}
    if not stacks:
        return None

    def run(*invals):
        env = dict(zip(jaxpr.constvars, closed.consts))
        env.update(zip(jaxpr.invars, invals))

        def read(v):
            return v.val if isinstance(v, Literal) else env[v]

        for eqn in jaxpr.eqns:
            if id(eqn) in stacks:
                with _compat.eqn_source(eqn):
                    env.update(zip(eqn.outvars, _peel_last(eqn, list(map(read, eqn.invars)))))
            else:
                bind_eqn(eqn, env, list(map(read, eqn.invars)))
        return [read(v) for v in jaxpr.outvars]

    avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type) for v in jaxpr.invars]
    # without dead code: the backward scan's last iteration computes the gradient of the loop's
    # initial carry, which nothing may need (layer 0's input gradient, the input being data)
    # (named as the user's program: plan labels and reports show argument paths, not invals[k])
    return _compat.with_debug_info(_compat.dce_closed_jaxpr(jax.make_jaxpr(run)(*avals)), original)


def eval_closed(closed: ClosedJaxpr, *args) -> list:
    """The outputs of ``closed`` on ``args``, its equations bound one by one (traceable)."""
    env = dict(zip(closed.jaxpr.constvars, closed.consts))
    env.update(zip(closed.jaxpr.invars, args))
    for eqn in closed.jaxpr.eqns:
        bind_eqn(eqn, env, [v.val if isinstance(v, Literal) else env[v] for v in eqn.invars])
    return [v.val if isinstance(v, Literal) else env[v] for v in closed.jaxpr.outvars]


def _peel_last(eqn, invals) -> list:
    """The outputs of the reverse scan ``eqn`` on ``invals``: iterations ``L-1 .. 1`` one scan,
    then iteration 0 (the last one run) inlined."""
    length, reverse, body = _compat.scan_info(eqn)
    assert reverse, eqn
    _, carry_pos, xs_pos = _compat.scan_operands(eqn.params, list(range(len(invals))))
    ncarry = len(carry_pos)

    def operands(carry, xs):
        ins = list(invals)
        for k, pos in enumerate(carry_pos):
            ins[pos] = carry[k]
        for pos in xs_pos:
            ins[pos] = xs(invals[pos])
        return ins

    subfuns, params = _compat.bind_params(eqn, length=length - 1)
    loop = eqn.primitive.bind(*subfuns, *operands([invals[p] for p in carry_pos],
                                                  lambda x: lax.slice_in_dim(x, 1, length, axis=0)), **params)
    last = eval_closed(body, *operands(loop[:ncarry], lambda x: lax.index_in_dim(x, 0, 0, keepdims=False)))
    return [*last[:ncarry], *(lax.concatenate([y[None], ys], 0) for y, ys in zip(last[ncarry:], loop[ncarry:]))]
