"""Cut a scanned layer stack of the loss forward into consecutive scans, so stages can cut it.

A loss whose layers are one ``scan`` (``lax.scan`` over stacked parameters, flax ``nn.scan``,
``nn.scan(nn.remat(...))``) is a single equation: no layer or stage boundary can fall inside it.
``split_layer_stack(loss, pieces)`` rewrites the loss's largest top-level scan over ``L`` iterations
into ``pieces`` scans over consecutive iteration ranges ``[a, b)`` (as even as possible), each
reading ``xs[a:b]`` and the previous piece's carry, with a ``pipeline_boundary`` equation between
pieces; the pieces' ``ys`` are concatenated back. Every piece runs the scan's own body, so each
iteration computes exactly what it did before.

Why here (the forward loss jaxpr, before layers are cut): every stage's backward is ``jax.vjp`` of
its own forward equations (``programs.stage``), so a sub-scan in a stage gets its backward scan from
JAX's scan transpose; nothing downstream needs to know the stack was one scan.
``stacked_params`` then turns the stacked inputs read only through these slices into one input
per piece, so each stage holds only its rows.
"""
from __future__ import annotations

import jax
from jax import lax
from jax.extend.core import ClosedJaxpr, Literal

from alpa_pass import _compat
from alpa_pass.errors import MeshError, TraceError
from alpa_pass.pipeline.trace.markers import boundary_p
from alpa_pass.pipeline.trace.step import eval_eqns


def layer_stack(loss: ClosedJaxpr):
    """The top-level ``scan`` equation with the most iterations (the first of equals), or None."""
    scans = [e for e in loss.jaxpr.eqns if e.primitive.name == "scan"]
    return max(scans, key=lambda e: int(e.params["length"]), default=None)


def check_splittable(loss: ClosedJaxpr, pieces: int, wanted: str) -> None:
    """Raise a typed error saying what to change when the loss has no scan that splits into
    ``pieces`` (``wanted`` names the option asking for them, for the message)."""
    stack = layer_stack(loss)
    if stack is None:
        loops = [e for e in loss.jaxpr.eqns if e.primitive.name == "while"]
        if loops:
            raise TraceError(f"{wanted} needs the loss cut into more layers, and its loop is a while loop "
                             f"(lax.while_loop, or fori_loop with traced bounds) whose trip count is not static, "
                             f"so PipeshardParallel cannot cut it between iterations; write the layer loop as "
                             f"lax.scan / nn.scan over stacked parameters, or add mark_pipeline_boundary() calls")
        return
    length = int(stack.params["length"])
    if pieces > length:
        raise MeshError(f"{wanted} needs the loss's layer stack (one scan over {length} iterations) cut into "
                        f"{pieces} pieces, but a scan can only be cut between its iterations; use at most "
                        f"{length} pieces there (fewer stages or layers), or add mark_pipeline_boundary() calls "
                        f"outside the scan")


def piece_bounds(length: int, pieces: int) -> list[int]:
    """The iteration ranges' boundaries ``[0, b1, ..., length]`` :func:`split_layer_stack` cuts
    ``length`` iterations into ``pieces`` ranges at (as even as possible)."""
    return [round(i * length / pieces) for i in range(pieces + 1)]


def split_layer_stack(loss: ClosedJaxpr, pieces: int) -> ClosedJaxpr:
    """``loss`` with :func:`layer_stack` cut into ``pieces`` scans (see the module docstring);
    ``loss`` itself when ``pieces <= 1`` or there is no scan. Call :func:`check_splittable` first."""
    stack = layer_stack(loss)
    if stack is None or pieces <= 1:
        return loss
    length = int(stack.params["length"])
    assert pieces <= length, (pieces, length)
    bounds = piece_bounds(length, pieces)
    jaxpr = loss.jaxpr

    def run(*args):
        env = dict(zip(jaxpr.constvars, loss.consts))
        env.update(zip(jaxpr.invars, args))
        for eqn in jaxpr.eqns:
            if eqn is stack:
                invals = [v.val if isinstance(v, Literal) else env[v] for v in eqn.invars]
                env.update(zip(eqn.outvars, _split_scan(eqn, invals, bounds)))
            else:
                eval_eqns([eqn], env)
        return [v.val if isinstance(v, Literal) else env[v] for v in jaxpr.outvars]

    return jax.make_jaxpr(run)(*[jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type)
                                 for v in jaxpr.invars])


def _split_scan(eqn, invals, bounds) -> list:
    """The outputs of scan ``eqn`` on ``invals``, computed as one scan per ``[a, b)`` of ``bounds``
    (in iteration order: last range first for a reverse scan), a pipeline_boundary between them."""
    p = eqn.params
    consts, carry, xs = _compat.scan_operands(p, invals)
    ncarry = len(carry)
    ranges = list(zip(bounds[:-1], bounds[1:]))
    order = ranges[::-1] if p["reverse"] else ranges
    ys_parts = {}
    for i, (a, b) in enumerate(order):
        if i:
            boundary_p.bind()
        piece_xs = [lax.slice_in_dim(x, a, b, axis=0) for x in xs]
        subfuns, params = _compat.bind_params(eqn, length=b - a)
        outs = eqn.primitive.bind(*subfuns, *consts, *carry, *piece_xs, **params)
        carry, ys_parts[(a, b)] = list(outs[:ncarry]), list(outs[ncarry:])
    ys = [lax.concatenate([ys_parts[r][k] for r in ranges], 0) for k in range(len(eqn.outvars) - ncarry)]
    return [*carry, *ys]
