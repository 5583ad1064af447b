"""Peel the boundary iterations of a scanned layer stack: its first and last iteration inlined.

A loop-carried value has ONE layout in the plan (the while's init, body argument, yield and result
are tied: issue 13), so a scan over layers hands every layer's activation (forward) and activation
gradient (backward) over in the same layout, the boundary layers too: the backward loop's last
iteration (layer 0) must produce the gradient in the loop's layout, and it is all-gathered there
although the embedding gradient wants it split (its unrolled twin's layer 0 hands it over with a
cheap all-to-all). :func:`peel_layer_scans` rewrites such a scan ``scan(body, length=L)`` into

    body(iteration first), scan(body, length=L-2) over xs[1:L-1], body(iteration last)

(for a reverse scan the first iteration run is ``L-1``), so the planner gives the boundary layers
their own layouts and the loop between them one layout. Every iteration runs the scan's own body
equations (the same ops: numerics equal); the ``ys`` are the inlined iterations' outputs and the
middle scan's, stacked in index order. A scan that reads another peeled scan's ``ys`` as its ``xs``
(the backward scan reading the forward scan's residuals) takes the three pieces as they are, so no
stacked residual is concatenated only to be sliced again.

Which scans (the rule, :func:`is_layer_stack`): a scan at the top level of the function (not
inside a ``jit``/``pjit`` call, a ``cond`` or another loop) with at least :data:`MIN_LENGTH`
iterations that walks over a floating-point argument of the function as it was passed (stacked
``[L, ...]`` parameters: ``lax.scan`` over stacked params, flax ``nn.scan`` and its backward
scan, which reads the same stacked params). A gradient-accumulation loop walks over micro-batches
the step cuts from its batch (a reshape, not an argument): not peeled; nor are loops over integer
arguments (token micro-batches) or short loops, whose boundary saves less than its copies cost.

Cost: two more copies of the loop body in the program (forward and backward: four), so the
module, the ILP (each copy's ops are planned, not tied to the loop's) and XLA's compile grow by
about two layers' worth each (``AutoShardingOption.peel_layer_scans=False`` turns it off).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import ClosedJaxpr, Literal

from alpa_pass import _compat

MIN_LENGTH = 3  # fewer iterations: peeling leaves no loop worth its two body copies


def is_layer_stack(eqn, args: set) -> bool:
    """Whether the top-level equation ``eqn`` is a scan to peel (see the module docstring);
    ``args``: the function's argument variables."""
    if eqn.primitive.name != "scan" or _compat.scan_info(eqn)[0] < MIN_LENGTH:
        return False
    _, _, xs = _compat.scan_operands(eqn.params, list(eqn.invars))
    return any(not isinstance(v, Literal) and v in args and jnp.issubdtype(v.aval.dtype, jnp.floating)
               for v in xs)


def peel_layer_scans(closed: ClosedJaxpr) -> ClosedJaxpr | None:
    """``closed`` with every layer-stack scan (:func:`is_layer_stack`) peeled, or None when it has
    none (nothing to rewrite)."""
    jaxpr = closed.jaxpr
    args = set(jaxpr.invars)
    stacks = {id(e) for e in jaxpr.eqns if is_layer_stack(e, args)}
    if not stacks:
        return None

    def run(*invals):
        env = dict(zip(jaxpr.constvars, closed.consts))
        env.update(zip(jaxpr.invars, invals))

        def read(v):
            if isinstance(v, Literal):
                return v.val
            x = env[v]
            if isinstance(x, _Pieces):
                x = env[v] = x.stacked()
            return x

        for eqn in jaxpr.eqns:
            if id(eqn) in stacks:
                invals_ = [v.val if isinstance(v, Literal) else env[v] for v in eqn.invars]
                with _compat.eqn_source(eqn):
                    env.update(zip(eqn.outvars, _peeled_scan(eqn, invals_)))
            else:
                _bind(eqn, env, list(map(read, eqn.invars)))
        return [read(v) for v in jaxpr.outvars]

    avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type) for v in jaxpr.invars]
    # without dead code: the backward scan's last iteration computes the gradient of the loop's
    # initial carry, which nothing may need (layer 0's input gradient, the input being data)
    return _compat.dce_closed_jaxpr(jax.make_jaxpr(run)(*avals))


def eval_closed(closed: ClosedJaxpr, *args) -> list:
    """The outputs of ``closed`` on ``args``, its equations bound one by one (traceable)."""
    env = dict(zip(closed.jaxpr.constvars, closed.consts))
    env.update(zip(closed.jaxpr.invars, args))
    for eqn in closed.jaxpr.eqns:
        _bind(eqn, env, [v.val if isinstance(v, Literal) else env[v] for v in eqn.invars])
    return [v.val if isinstance(v, Literal) else env[v] for v in closed.jaxpr.outvars]


def _bind(eqn, env: dict, invals: list) -> None:
    """Bind ``eqn``'s primitive on ``invals`` (at the user's source location), its outputs into ``env``."""
    subfuns, params = _compat.bind_params(eqn)
    with _compat.eqn_source(eqn):
        outs = eqn.primitive.bind(*subfuns, *invals, **params)
    env.update(zip(eqn.outvars, outs if eqn.primitive.multiple_results else [outs]))


@dataclasses.dataclass
class _Pieces:
    """A stacked ``[L, ...]`` value kept as (iteration 0, iterations 1..L-2 stacked, iteration L-1)
    until something other than a peeled scan reads it whole."""

    first: object
    middle: object
    last: object

    def stacked(self):
        return lax.concatenate([self.first[None], self.middle, self.last[None]], 0)


def _peeled_scan(eqn, invals) -> list:
    """The outputs of scan ``eqn`` on ``invals`` (``_Pieces`` allowed among its xs): its first and
    last iteration inlined, the others one scan; ys as ``_Pieces``."""
    length, reverse, body = _compat.scan_info(eqn)
    positions = _compat.scan_operands(eqn.params, list(range(len(invals))))
    ncarry = len(positions[1])

    def whole(x):
        return x.stacked() if isinstance(x, _Pieces) else x

    def at(x, i):
        if isinstance(x, _Pieces):
            return x.first if i == 0 else x.last
        return lax.index_in_dim(x, i, 0, keepdims=False)

    def middle(x):
        return x.middle if isinstance(x, _Pieces) else lax.slice_in_dim(x, 1, length - 1, axis=0)

    consts = {pos: whole(invals[pos]) for pos in positions[0]}

    def operands(carry, xs):
        ins = [consts[pos] if pos in consts else None for pos in range(len(invals))]
        for k, pos in enumerate(positions[1]):
            ins[pos] = carry[k]
        for pos in positions[2]:
            ins[pos] = xs(invals[pos])
        return ins

    def iteration(i, carry):
        outs = eval_closed(body, *operands(carry, lambda x: at(x, i)))
        return list(outs[:ncarry]), list(outs[ncarry:])

    first, last = (length - 1, 0) if reverse else (0, length - 1)
    carry = [whole(invals[pos]) for pos in positions[1]]
    carry, ys_first = iteration(first, carry)
    subfuns, params = _compat.bind_params(eqn, length=length - 2)
    outs = eqn.primitive.bind(*subfuns, *operands(carry, middle), **params)
    carry, ys_mid = list(outs[:ncarry]), list(outs[ncarry:])
    carry, ys_last = iteration(last, carry)
    if reverse:
        ys_first, ys_last = ys_last, ys_first
    return [*carry, *(_Pieces(a, m, b) for a, m, b in zip(ys_first, ys_mid, ys_last))]
