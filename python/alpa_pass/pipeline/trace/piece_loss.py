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
from jax.extend.core import ClosedJaxpr, Literal

from alpa_pass.pipeline.trace import piece_rules
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
        if piece_range(e, v) in ranges:
            return True
        if piece_rules.piece_rule(e, length) == "map" and all(through_pieces(o) for o in e.outvars):
            chain.add(id(e))
            return True
        return False

    found = {k for k, v in enumerate(jaxpr.invars)
             if not batch_mask[k] and not jax.dtypes.issubdtype(v.aval.dtype, jax.dtypes.extended)
             and through_pieces(v)}
    return found, chain


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
    """``loss`` with each input position in ``split_k`` replaced (in place) by one input per piece
    (``chain``: the ``"map"`` equations of :func:`piece_read_inputs`, run per piece)."""
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
                vals.env[e.outvars[0]] = vals.piece(v, ranges.index(piece_range(e, v)))
            else:
                for x in e.invars:
                    vals.whole(x)
                eval_eqns([e], vals.env)
        return [vals.whole(v) for v in jaxpr.outvars]

    return jax.make_jaxpr(run)(*avals)
