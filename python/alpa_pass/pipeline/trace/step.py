"""Trace a train step for the pipeline pass: find its ``grad_marker`` and its loss's forward jaxpr.

Contract: ``trace_step(fn, args, batch_argnums)`` returns a ``TracedStep`` whose ``step`` jaxpr
holds exactly one top-level ``grad_marker`` equation (from ``alpa_pass.value_and_grad``/``grad``)
whose inputs are arguments of the step, and whose ``loss`` jaxpr is the marked function's forward
(inputs = the marker's inputs; outputs: the scalar float loss, then the aux leaves when the
marked function has ``has_aux``), with ``pipeline_boundary`` equations where
the user called ``mark_pipeline_boundary()``.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal, subjaxprs

from alpa_pass.errors import TraceError
from alpa_pass.pipeline.trace.markers import GradInfo, boundary_p, grad_marker_p, recording_boundaries, recording_grads
from alpa_pass.trace.lower import fn_name, leaf_aval
from alpa_pass.trace import inline as trace_inline


@dataclasses.dataclass
class TracedStep:
    """A train step split at its gradient marker.

    Attributes:
      step: closed jaxpr of the flattened step (inputs: argument leaves; outputs: output leaves).
      out_tree: the step's output treedef.
      marker: the ``grad_marker`` equation; ``info`` its GradInfo.
      marker_arg: per marker input, the step argument leaf it is.
      batch_mask: per marker input, whether it is (part of) a batch argument.
      loss: closed jaxpr of the loss forward (inputs = marker inputs; outputs: the scalar loss,
        then the aux leaves at one micro-batch).
    """

    step: ClosedJaxpr
    out_tree: object
    marker: object
    info: GradInfo
    marker_arg: list
    batch_mask: list
    loss: ClosedJaxpr


def eval_eqns(eqns, env: dict) -> None:
    """Evaluate jaxpr equations in order, reading and writing ``env`` (var -> value)."""
    for eqn in eqns:
        invals = [v.val if isinstance(v, Literal) else env[v] for v in eqn.invars]
        params = eqn.primitive.get_bind_params(eqn.params)
        subfuns, params = params if isinstance(params, tuple) else ((), params)  # (jax < 0.10 form)
        outs = eqn.primitive.bind(*subfuns, *invals, **params)
        env.update(zip(eqn.outvars, outs if eqn.primitive.multiple_results else [outs]))


def contains_primitive(eqn, prim) -> bool:
    """Whether ``prim`` appears inside the sub-jaxprs of ``eqn`` (at any depth)."""
    stack = [j.jaxpr if isinstance(j, ClosedJaxpr) else j for j in jax.tree.leaves(
        eqn.params, is_leaf=lambda x: isinstance(x, (ClosedJaxpr, Jaxpr))) if isinstance(j, (ClosedJaxpr, Jaxpr))]
    while stack:
        jaxpr = stack.pop()
        if any(e.primitive is prim for e in jaxpr.eqns):
            return True
        stack.extend(subjaxprs(jaxpr))
    return False


def trace_step(fn, args, batch_argnums, loss_avals) -> TracedStep:
    """Trace ``fn(*args)`` (arrays or ShapeDtypeStructs) and its loss; see the module contract.

    ``loss_avals(marker_input_avals, batch_mask)`` gives the avals the loss is traced at (e.g. the
    batch leaves cut to one micro-batch).
    """
    leaves, in_tree = jax.tree.flatten(args)
    avals = [leaf_aval(x) for x in leaves]
    trees = {}

    def flat_step(*flat):
        out = fn(*jax.tree.unflatten(in_tree, flat))
        out_leaves, trees["out"] = jax.tree.flatten(out)
        return out_leaves

    with recording_grads():
        step = inline_calls(jax.make_jaxpr(flat_step)(*avals))
    marker = _the_marker(step, fn)
    arg_of = {v: i for i, v in enumerate(step.jaxpr.invars)}
    marker_arg = []
    for v in marker.invars:
        if isinstance(v, Literal) or v not in arg_of:
            raise TraceError(f"PipeshardParallel: the inputs of alpa_pass.value_and_grad in {fn_name(fn)} must be "
                             f"the step's arguments (or parts of them), not values computed in the step; "
                             f"compute them inside the loss function instead")
        marker_arg.append(arg_of[v])
    batch_leaves = set()
    start = 0
    for i, a in enumerate(args):
        n = len(jax.tree.leaves(a))
        if i in batch_argnums:
            batch_leaves.update(range(start, start + n))
        start += n
    info = marker.params["info"]
    batch_mask = [i in batch_leaves for i in marker_arg]
    loss_info = info
    if info.num_hoisted:
        # the loss closes over step values (``def loss_fn(params): ... batch ...``): its hoisted
        # form replays a jaxpr traced at full-batch shapes (a mean's divisor is a literal there),
        # so take the loss from the step traced again at one micro-batch
        micro = loss_avals(avals, [i in batch_leaves for i in range(len(avals))])
        if micro != avals:
            with recording_grads():
                loss_info = _the_marker(inline_calls(jax.make_jaxpr(flat_step)(*micro)), fn).params["info"]
    loss = _trace_loss(loss_info, loss_avals([avals[i] for i in marker_arg], batch_mask))
    return TracedStep(step, trees["out"], marker, info, marker_arg, batch_mask, loss)


def inline_calls(closed: ClosedJaxpr) -> ClosedJaxpr:
    """``closed`` with its top-level jit calls inlined (recursively), the marker's untouched.

    The apply (the step after its gradient marker) is split per stage equation by equation; a
    jitted helper such as optax's ``tree_bias_correction`` (a ``jit`` equation on jax >= 0.11)
    would otherwise be one equation reading every stage's optimizer state, forced onto the whole
    mesh. Re-traced from the same avals, so the result computes exactly what ``closed`` does.
    """
    return trace_inline.inline_calls(closed, should=lambda eqn: not contains_primitive(eqn, grad_marker_p))


def _the_marker(step: ClosedJaxpr, fn):
    markers = [e for e in step.jaxpr.eqns if e.primitive is grad_marker_p]
    nested = [e for e in step.jaxpr.eqns if contains_primitive(e, grad_marker_p)]
    if nested:
        raise TraceError(f"PipeshardParallel: alpa_pass.value_and_grad is called inside "
                         f"{nested[0].primitive.name} in {fn_name(fn)}; call it at the top level of the train step")
    if len(markers) != 1:
        raise TraceError(f"PipeshardParallel needs exactly one alpa_pass.value_and_grad/alpa_pass.grad call in "
                         f"{fn_name(fn)} (it marks where gradients are complete), found {len(markers)}; "
                         f"replace jax.value_and_grad by alpa_pass.value_and_grad")
    return markers[0]


def _trace_loss(info: GradInfo, avals) -> ClosedJaxpr:
    def flat_loss(*flat):
        out = info.fun(*jax.tree.unflatten(info.in_tree, flat))
        return jax.tree.leaves(out)

    with recording_boundaries():
        loss = jax.make_jaxpr(flat_loss)(*avals)
    nested = [e for e in loss.jaxpr.eqns if contains_primitive(e, boundary_p)]
    if nested:
        raise TraceError(f"mark_pipeline_boundary() is called inside {nested[0].primitive.name} "
                         f"(a jit, checkpoint, scan or cond) in {fn_name(info.fun)}; pipeline boundaries must "
                         f"not nest inside other transformations: call it at the top level of the loss function")
    out = loss.jaxpr.outvars
    if (len(out) != 1 + num_aux(info) or out[0].aval.shape != ()
            or not jax.numpy.issubdtype(out[0].aval.dtype, np.floating)):
        raise TraceError(f"the loss function {fn_name(info.fun)} must return one float scalar"
                         f"{' and its aux' if info.has_aux else ''}, got {[v.aval for v in out]}")
    computed = {v for e in loss.jaxpr.eqns for v in e.outvars}
    for v in out[1:]:
        if isinstance(v, Literal) or v not in computed or v.aval.dtype == np.bool_:
            raise TraceError(f"an aux output of {fn_name(info.fun)} ({v.aval}) is a constant, an argument or a "
                             f"bool; PipeshardParallel combines aux over micro-batches, so return values computed "
                             f"in the loss function, as float or int arrays")
    return loss


def num_aux(info: GradInfo) -> int:
    """How many aux leaves the marked loss returns (0 without ``has_aux``)."""
    return len(info.out_avals) - 1 - sum(info.diff_mask) if info.has_aux else 0
