"""The loss over per-piece inputs: which stacked loss inputs are read only through the pieces, and
the loss rewritten to take one input per piece instead (``stacked_params`` uses both).

A loss input ``x`` is *read through the pieces* when every equation reading it is a slice
``x[a:b]`` of dim 0 for one of the pieces' ranges (what ``scan_split`` emits before each piece's
scan), or a ``"map"`` equation (``piece_rules``: a cast to bfloat16 before the scan, a scale) whose
outputs are in turn read through the pieces. The rewritten loss runs such ``"map"`` equations once
per piece, each where the loss first reads that piece (just before the piece's scan), so a stage
reads only its own pieces; the slices become the piece inputs themselves.
"""
from __future__ import annotations

import jax
from jax import lax
from jax.extend.core import ClosedJaxpr, Literal

from alpa_pass.pipeline.trace import piece_rules
from alpa_pass.pipeline.trace.markers import boundary_p
from alpa_pass.pipeline.trace.step import eval_eqns


def piece_read_inputs(loss: ClosedJaxpr, batch_mask, ranges) -> tuple[set, set]:
    """``(positions, chain)``: the loss input positions (not batch, not PRNG keys) read through
    the pieces of ``ranges`` (module docstring), and the ids of the ``"map"`` equations on the way."""
    jaxpr, length = loss.jaxpr, ranges[-1][1]
    readers = {}
    for e in jaxpr.eqns:
        for v in e.invars:
            if not isinstance(v, Literal):
                readers.setdefault(v, []).append(e)
    outs = {v for v in jaxpr.outvars if not isinstance(v, Literal)}
    memo, chain = {}, set()

    def through_pieces(v) -> bool:
        if v not in memo:
            memo[v] = False
            memo[v] = v not in outs and bool(readers.get(v)) and all(reads_piece(e, v) for e in readers[v])
        return memo[v]

    def reads_piece(e, v) -> bool:
        if group_of(piece_range(e, v), ranges) is not None:
            return True
        if piece_rules.piece_rule(e, length) == "map" and all(through_pieces(o) for o in e.outvars):
            chain.add(id(e))
            return True
        return False

    found = {k for k, v in enumerate(jaxpr.invars)
             if not batch_mask[k] and not jax.dtypes.issubdtype(v.aval.dtype, jax.dtypes.extended)
             and through_pieces(v)}
    return found, chain


def group_of(sub, ranges):
    """The index of the range of ``ranges`` holding ``sub`` (an ``(a, b)`` or None), else None."""
    if sub is None:
        return None
    return next((g for g, (a, b) in enumerate(ranges) if a <= sub[0] < sub[1] <= b), None)


def piece_range(eqn, v):
    """``(a, b)`` when ``eqn`` is ``v[a:b]`` along dim 0 (whole along the others), else None."""
    if eqn.primitive.name != "slice" or eqn.invars[0] is not v:
        return None
    p, shape = eqn.params, tuple(v.aval.shape)
    start, limit = tuple(p["start_indices"]), tuple(p["limit_indices"])
    strides = p.get("strides")
    if (strides is not None and any(s != 1 for s in strides)) or any(s != 0 for s in start[1:]) \
            or limit[1:] != shape[1:]:
        return None
    return (int(start[0]), int(limit[0]))


def piece_loss(loss: ClosedJaxpr, split_k: set, chain: set, ranges) -> ClosedJaxpr:
    """``loss`` with each input position in ``split_k`` replaced (in place) by one input per range
    of ``ranges`` (``chain``: the ``"map"`` equations of :func:`piece_read_inputs`, run per range;
    a slice within a range is sliced from that range's input)."""
    jaxpr = loss.jaxpr
    rows = [b - a for a, b in ranges]
    avals = []
    for k, v in enumerate(jaxpr.invars):
        shapes = [(r, *v.aval.shape[1:]) for r in rows] if k in split_k else [tuple(v.aval.shape)]
        avals += [jax.ShapeDtypeStruct(s, v.aval.dtype, weak_type=v.aval.weak_type) for s in shapes]

    def run(*flat):
        vals = piece_rules.PieceValues(ranges)
        vals.env.update(zip(jaxpr.constvars, loss.consts))
        it = iter(flat)
        for k, v in enumerate(jaxpr.invars):
            if k in split_k:
                vals.pieces[v] = [next(it) for _ in ranges]
            else:
                vals.env[v] = next(it)
        for e in jaxpr.eqns:
            v = e.invars[0] if e.invars else None
            if id(e) in chain:
                vals.defer(e, rows)
            elif e.primitive.name == "slice" and (v in vals.pieces or v in vals.lazy):
                sub = piece_range(e, v)
                g = group_of(sub, ranges)
                x = vals.piece(v, g)
                if sub != ranges[g]:  # a piece of a larger range: sliced from it
                    x = lax.slice_in_dim(x, sub[0] - ranges[g][0], sub[1] - ranges[g][0], axis=0)
                vals.env[e.outvars[0]] = x
            else:
                for x in e.invars:
                    vals.whole(x)
                eval_eqns([e], vals.env)
        return [vals.whole(v) for v in jaxpr.outvars]

    return jax.make_jaxpr(run)(*avals)


def merge_pieces(loss: ClosedJaxpr, split_k, ranges, groups, layers) -> ClosedJaxpr:
    """A loss over per-piece inputs (:func:`piece_loss` of ``ranges``; ``split_k``: the original
    input positions cut) as the same loss over per-group inputs (``groups``: unions of consecutive
    ranges, e.g. the pieces one stage holds): each piece is sliced from its group where the loss
    first reads it, and a ``pipeline_boundary`` separates the equations of consecutive ``layers``
    (layers of ``loss``; the loss's own boundaries are dropped), so the result cuts into the same
    layers."""
    jaxpr, n = loss.jaxpr, len(ranges)
    layer_of = {id(e): i for i, layer in enumerate(layers) for e in layer}
    owner = [group_of(r, groups) for r in ranges]
    avals, slots, pos = [], [], 0  # slots: per original input, its per-piece invars (or one)
    for k in range(len(jaxpr.invars) - (n - 1) * len(split_k)):
        if k in split_k:
            v = jaxpr.invars[pos]
            avals += [jax.ShapeDtypeStruct((b - a, *v.aval.shape[1:]), v.aval.dtype, weak_type=v.aval.weak_type)
                      for a, b in groups]
            slots.append(jaxpr.invars[pos:pos + n])
            pos += n
        else:
            v = jaxpr.invars[pos]
            avals.append(jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type))
            slots.append([v])
            pos += 1

    def run(*flat):
        env, lazy, it = dict(zip(jaxpr.constvars, loss.consts)), {}, iter(flat)
        for k, vs in enumerate(slots):
            if k not in split_k:
                env[vs[0]] = next(it)
                continue
            parts = [next(it) for _ in groups]
            for j, v in enumerate(vs):
                lazy[v] = (parts[owner[j]], ranges[j][0] - groups[owner[j]][0], ranges[j][1] - groups[owner[j]][0])
        current = None
        for e in jaxpr.eqns:
            if e.primitive is boundary_p:
                continue
            if current is not None and layer_of[id(e)] != current:
                boundary_p.bind()
            current = layer_of[id(e)]
            for v in e.invars:
                if not isinstance(v, Literal) and v not in env and v in lazy:
                    x, a, b = lazy[v]
                    env[v] = x if (a, b) == (0, x.shape[0]) else lax.slice_in_dim(x, a, b, axis=0)
            eval_eqns([e], env)
        return [v.val if isinstance(v, Literal) else env[v] for v in jaxpr.outvars]

    return jax.make_jaxpr(run)(*avals)
