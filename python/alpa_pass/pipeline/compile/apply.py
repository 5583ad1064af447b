"""Plan and compile the apply programs: each on its stage's submesh (or, for cross-stage
equations, on the whole cluster mesh), with the layouts the data already has pinned.

Pinned inputs (so a step's outputs fed back in move nothing): a parameter keeps the layout its
stage's forward reads it in and a FREE input (step counter) is replicated. Optimizer state is laid
out by the planner; every state output gets its input's layout (``tie_outputs_to_inputs``).
Gradient accumulators are not pinned: pinning them to the backward's layout too makes the ILP
infeasible whenever an update op merged as a follower of the gradient must also match the
parameter's (tied) layout; the planner's layout for them costs one reshard within the submesh.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from alpa_pass.driver.jit import plan_and_compile
from alpa_pass.pipeline.programs.apply import ApplyProgram, MarkerLayout
from alpa_pass.pipeline.programs.apply_sites import CROSS, FREE
from alpa_pass.trace.lower import leaf_aval


@dataclasses.dataclass
class CompiledApply:
    """One apply executable: its program, where it runs (``site``: stage index or "cross";
    ``mesh``: the LogicalMesh planned on), its Plan and the jax ``Compiled``."""

    program: ApplyProgram
    site: object
    mesh: object
    plan: object
    exe: object

    @property
    def in_shardings(self) -> list:
        return list(jax.tree.leaves(self.exe.input_shardings[0]))


def marker_layout(stages, num_marker_inputs: int, num_micro: int) -> MarkerLayout:
    """Owners of the marker's outputs: a parameter belongs to the first stage reading it (the last
    stage when none does), the loss and each aux leaf to the stage computing them."""
    users = tuple(tuple(i for i, c in enumerate(stages)
                        if any(c.program.sources[v] == ("arg", k) for v in c.program.param_inputs))
                  for k in range(num_marker_inputs))
    last = len(stages) - 1
    loss_stage = next(i for i, c in enumerate(stages) if c.program.loss_output is not None)
    n_aux = sum(len(c.program.aux_outputs) for c in stages)
    aux_stage = tuple(next(i for i, c in enumerate(stages) if j in c.program.aux_outputs) for j in range(n_aux))
    return MarkerLayout(tuple(u[0] if u else last for u in users), users, loss_stage, aux_stage,
                        num_micro, len(stages))


def free_sharding(stages) -> NamedSharding:
    """Replicated over every stage's devices, in stage order: where FREE step outputs live."""
    devices = [d for c in stages for d in c.spec.mesh.devices]
    return NamedSharding(Mesh(np.array(devices, dtype=object), ("stages",)), PartitionSpec())


def core_spec(sharding: NamedSharding, mesh) -> list[int]:
    """A NamedSharding on ``mesh``'s jax mesh as a core spec (tensor dim per mesh axis, -1 = none)."""
    names = list(mesh.axis_names)
    spec = [-1] * len(names)
    for dim, entry in enumerate(sharding.spec):
        for axis in (entry,) if isinstance(entry, str) else (entry or ()):
            if mesh.shape[names.index(axis)] > 1:
                spec[names.index(axis)] = dim
    return spec


def compile_apply(programs, sites, traced, stages, cluster, method, step_leaves) -> list[CompiledApply]:
    """Plan and compile every apply program (in run order) on its site's mesh; ``sites``: the
    ``apply_sites.Sites`` the programs were cut by."""
    avals = _key_avals(traced, step_leaves)
    pins = _known_layouts(traced, stages)
    out = []
    for prog in programs:
        mesh = cluster if prog.site == CROSS else stages[prog.site].spec.mesh
        args = tuple(tuple(avals(k) for k in group) for group in prog.inputs)
        pinned = [_pin(k, prog.site, pins, mesh, sites) for k in prog.flat_inputs]
        fn = prog.function(dict(zip(traced.step.jaxpr.constvars, traced.step.consts)), method.num_micro_batches)
        fn.__qualname__ = f"apply_{prog.site}_phase{prog.phase}"
        donate = (0,) if prog.inputs[0] else ()
        plan, exe = plan_and_compile(fn, args, mesh, method.option, donate, pinned_args=pinned)
        out.append(CompiledApply(prog, prog.site, mesh, plan, exe))
    return out


def _key_avals(traced, step_leaves):
    """key -> ShapeDtypeStruct for every apply input key (vars and pipeline results)."""
    loss_out = traced.loss.jaxpr.outvars
    marker_in = traced.loss.jaxpr.invars

    def aval(key):
        if isinstance(key, tuple):
            v = {"loss": lambda: loss_out[0], "aux": lambda: loss_out[1 + key[1]],
                 "grad": lambda: marker_in[key[1]]}[key[0]]()
        else:
            v = key
        if v in index:
            return leaf_aval(step_leaves[index[v]])
        return jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype)

    index = {v: i for i, v in enumerate(traced.step.jaxpr.invars)}
    return aval


def _known_layouts(traced, stages) -> dict:
    """(stage, step input var) -> the NamedSharding the stage's forward reads that parameter (a
    non-batch marker input) in."""
    out = {}
    invars = traced.step.jaxpr.invars
    for s, c in enumerate(stages):
        prog = c.program
        for v, sh in zip((*prog.diff_inputs, *prog.nondiff_inputs), c.in_shardings("fwd")):
            kind, k = prog.sources[v]
            if kind == "arg" and not traced.batch_mask[k]:
                out[(s, invars[traced.marker_arg[k]])] = sh
    return out


def _pin(key, site, pins, mesh, sites):
    """The core spec an input of a program on ``site`` must have, or None (the planner chooses)."""
    if site == CROSS:
        return None
    if (site, key) in pins:
        return core_spec(pins[(site, key)], mesh)
    if not isinstance(key, tuple) and sites.site(key) == FREE:
        return [-1] * len(mesh.shape)
    return None
