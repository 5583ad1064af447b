"""Layers: the loss forward's equations cut into consecutive groups.

``manual_layers`` cuts at the user's ``mark_pipeline_boundary()`` equations; ``auto_layers`` asks
the C++ layer-clustering DP for ``layer_num`` groups of balanced FLOPs that cut few bytes.
"""
from __future__ import annotations

import jax
import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal

from alpa_pass import _core
from alpa_pass.errors import TraceError
from alpa_pass.pipeline.trace.markers import boundary_p


def manual_layers(loss: ClosedJaxpr) -> list[list]:
    """The equations between ``pipeline_boundary`` markers (empty first/last groups dropped)."""
    layers, cur = [], []
    for eqn in loss.jaxpr.eqns:
        if eqn.primitive is boundary_p:
            layers.append(cur)
            cur = []
        else:
            cur.append(eqn)
    layers.append(cur)
    while layers and not layers[0]:
        layers.pop(0)
    while layers and not layers[-1]:
        layers.pop()
    for i, layer in enumerate(layers):
        if not layer:
            raise TraceError(f"layer {i} is empty: two mark_pipeline_boundary() calls with no computation "
                             f"between them; remove one of them")
    return layers


def eqn_flops(eqn) -> float:
    """A FLOP estimate: 2·M·N·K for dot_general, output elements for other primitives; an equation
    with sub-jaxprs (jit, remat, custom_vjp, cond, ...) costs what they hold (a scan: times its
    length), so a scanned layer stack weighs what its layers do when the layer DP balances FLOPs."""
    subs = [j.jaxpr if isinstance(j, ClosedJaxpr) else j for j in jax.tree.leaves(
        eqn.params, is_leaf=lambda x: isinstance(x, (ClosedJaxpr, Jaxpr))) if isinstance(j, (ClosedJaxpr, Jaxpr))]
    if subs:
        inner = [sum(eqn_flops(e) for e in j.eqns) for j in subs]
        # cond runs one branch; a scan runs its body ``length`` times
        total = max(inner) if eqn.primitive.name == "cond" else sum(inner)
        return total * float(eqn.params.get("length", 1)) if eqn.primitive.name == "scan" else total
    out = sum(float(np.prod(v.aval.shape)) for v in eqn.outvars if hasattr(v.aval, "shape"))
    if eqn.primitive.name == "dot_general":
        (lhs_contract, _), _ = eqn.params["dimension_numbers"]
        k = float(np.prod([eqn.invars[0].aval.shape[d] for d in lhs_contract]))
        return 2.0 * out * k
    return out


def var_bytes(v) -> float:
    aval = v.aval
    return float(np.prod(aval.shape)) * np.dtype(aval.dtype).itemsize if hasattr(aval, "shape") else 0.0


def auto_layers(loss: ClosedJaxpr, layer_num: int, eps: float) -> list[list]:
    """Cluster the (boundary-free) equations into ``layer_num`` layers with the C++ DP.

    Cost of a cut after equation i = bytes of values defined at or before i and read after it
    (loss inputs excluded: every stage reads its own copy). Each layer may hold at most
    ``(1 + eps) * total / layer_num`` FLOPs (relaxed to the largest single equation if needed).
    """
    eqns = [e for e in loss.jaxpr.eqns if e.primitive is not boundary_p]
    if layer_num > len(eqns):
        raise TraceError(f"AutoLayerOption(layer_num={layer_num}) asks for more layers than the loss has "
                         f"operators ({len(eqns)})")
    flops = np.array([eqn_flops(e) for e in eqns], np.float64)
    cut = _cut_bytes(eqns, loss.jaxpr.outvars)
    bounds = _core.cluster_layers(flops, cut, int(layer_num), float(eps))
    return [eqns[a:b] for a, b in zip([0, *bounds], [*bounds, len(eqns)])]


def _cut_bytes(eqns, outvars) -> np.ndarray:
    """cut[i] = bytes live across the gap after equation i (n - 1 gaps)."""
    n = len(eqns)
    defined, last_use = {}, {}
    for i, e in enumerate(eqns):
        for v in e.invars:
            if not isinstance(v, Literal) and v in defined:
                last_use[v] = i
        for v in e.outvars:
            defined[v] = i
    for v in outvars:
        if not isinstance(v, Literal) and v in defined:
            last_use[v] = n
    diff = np.zeros(n + 1)
    for v, d in defined.items():
        if v in last_use and last_use[v] > d:
            diff[d] += var_bytes(v)
            diff[last_use[v]] -= var_bytes(v)
    return np.cumsum(diff)[: n - 1]
