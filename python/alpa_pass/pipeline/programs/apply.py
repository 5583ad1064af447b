"""Apply programs: the train step outside its gradient marker (the optimizer update), cut per
site and phase (``apply_sites``), each a function the intra-op planner compiles on its site's mesh.

Contract: ``build_apply(traced, layout, donated, ties)`` returns the ``ApplyProgram``s in run
order. A program is ``fn(donated_state, kept_state, other) -> (donated_state', kept_state',
other')``: ``*_state`` pair step inputs with the step outputs that are their new values (same
position; the planner ties their shardings, and the donated ones are donated), ``other`` holds
the remaining inputs (step inputs, values of earlier programs, pipeline results) and outputs
(values later programs read, step outputs). Pipeline results are keyed ``("loss", m)``,
``("grad", k, t)`` (stage ``t``'s accumulated gradient of marker input ``k``) and
``("aux", j, m)``; every other key is a jaxpr var.

The gradient marker's outputs are made at the start of their owner's phase-0 program: a
gradient is the sum of its stages' accumulators divided by the micro-batch count, the loss the
mean of the micro-batch losses, and an aux leaf (``has_aux``) is combined like Alpa does:
reduced when its shape does not depend on the batch (float: mean over micro-batches; integer:
sum, e.g. a count of correct predictions), concatenated along axis 0 when it does.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax.extend.core import Literal

from alpa_pass.errors import TraceError
from alpa_pass.pipeline.programs.apply_sites import CROSS, FREE, Sites, assign_sites, in_vars
from alpa_pass.pipeline.trace.step import TracedStep, eval_eqns, num_aux


@dataclasses.dataclass(frozen=True)
class MarkerLayout:
    """Where the gradient marker's outputs come from.

    Attributes:
      owner: per marker input, the stage holding that parameter and its optimizer update.
      grad_users: per marker input, the stages whose accumulators hold parts of its gradient.
      loss_stage: the stage computing the loss; aux_stage: per aux leaf, the stage computing it.
      num_micro: micro-batches per step; num_stages: pipeline stages.
    """

    owner: tuple
    grad_users: tuple
    loss_stage: int
    aux_stage: tuple
    num_micro: int
    num_stages: int


@dataclasses.dataclass
class MarkerDef:
    """A marker output made from pipeline results: ``rule`` in grad/mean/sum/concat over ``parts``."""

    var: object
    site: int
    rule: str
    parts: list


@dataclasses.dataclass
class ApplyProgram:
    """One apply executable's function: ``eqns`` (step order, FREE ones included) after ``defs``;
    ``inputs``/``outputs``: three key lists each (donated state, kept state, other)."""

    site: object
    phase: int
    eqns: list
    defs: list
    inputs: tuple
    outputs: tuple

    @property
    def flat_inputs(self) -> list:
        return [k for group in self.inputs for k in group]

    @property
    def flat_outputs(self) -> list:
        return [v for group in self.outputs for v in group]

    def function(self, consts: dict, num_micro: int):
        """The program as a Python function of three tuples (see the module contract)."""

        def fn(donated, kept, other):
            env = dict(consts)
            env.update(zip(self.flat_inputs, (*donated, *kept, *other)))
            for d in self.defs:
                env[d.var] = _combine(d, [env[k] for k in d.parts], num_micro)
            eval_eqns(self.eqns, env)
            return tuple(tuple(v.val if isinstance(v, Literal) else env[v] for v in g) for g in self.outputs)

        return fn


def aux_rule(micro_aval, full_aval, num_micro: int) -> str:
    """How an aux leaf combines over micro-batches: "mean" (float) / "sum" (integer) when its shape
    does not depend on the batch, "concat" (axis 0) when the full batch makes it ``num_micro`` x longer."""
    if tuple(micro_aval.shape) == tuple(full_aval.shape):
        return "mean" if jnp.issubdtype(micro_aval.dtype, jnp.inexact) else "sum"
    m, f = tuple(micro_aval.shape), tuple(full_aval.shape)
    if m and f and f[0] == m[0] * num_micro and f[1:] == m[1:]:
        return "concat"
    raise TraceError(f"an aux output has shape {m} per micro-batch but {f} for the whole batch; PipeshardParallel "
                     f"reduces aux values whose shape does not depend on the batch and concatenates along "
                     f"axis 0 those whose axis 0 is the batch")


def _combine(d: MarkerDef, parts, num_micro: int):
    if d.rule == "grad":
        aval = d.var.aval
        return sum(parts, jnp.zeros(aval.shape, aval.dtype)) / num_micro
    if d.rule == "concat":
        return jnp.concatenate(parts, axis=0)
    total = sum(parts[1:], parts[0])
    return total / num_micro if d.rule == "mean" else total


def marker_defs(traced: TracedStep, layout: MarkerLayout) -> list[MarkerDef]:
    """Every output of the gradient marker as a MarkerDef on the stage that owns it."""
    outs, m = traced.marker.outvars, range(layout.num_micro)
    n_aux = num_aux(traced.info)
    defs = [MarkerDef(outs[0], layout.loss_stage, "mean", [("loss", i) for i in m])]
    for j in range(n_aux):
        rule = aux_rule(traced.loss.jaxpr.outvars[1 + j].aval, outs[1 + j].aval, layout.num_micro)
        defs.append(MarkerDef(outs[1 + j], layout.aux_stage[j], rule, [("aux", j, i) for i in m]))
    diff = [k for k, d in enumerate(traced.info.diff_mask) if d]
    for var, k in zip(outs[1 + n_aux:], diff):
        defs.append(MarkerDef(var, layout.owner[k], "grad", [("grad", k, t) for t in layout.grad_users[k]]))
    return defs


def build_apply(traced: TracedStep, layout: MarkerLayout, donated: set, ties: dict) -> tuple[list, Sites]:
    """The apply programs in run order, and the sites (see the module contract).

    ``donated``: step input leaf indices whose buffers may be donated; ``ties``: step output leaf
    index -> step input leaf index it is the new value of.
    """
    jaxpr = traced.step.jaxpr
    eqns = [e for e in jaxpr.eqns if e is not traced.marker]
    defs = marker_defs(traced, layout)
    seeds = {d.var: d.site for d in defs}
    for k, i in enumerate(traced.marker_arg):
        if traced.info.diff_mask[k]:
            seeds[jaxpr.invars[i]] = layout.owner[k]
    sites = assign_sites(eqns, seeds)
    bodies = _bodies(eqns, sites, defs, jaxpr.outvars, layout.num_stages)
    programs = [_program(key, eqns, sites, bodies, jaxpr) for key in bodies]
    _fill_outputs(programs, jaxpr, sites)
    _pair_state(programs, jaxpr, sites, donated, ties)
    return programs, sites


def _bodies(eqns, sites: Sites, defs, outvars, num_stages) -> dict:
    """(site, phase) -> (equation indices, used marker defs), in run order."""
    read = {v for e in eqns for v in in_vars(e)} | {v for v in outvars if not isinstance(v, Literal)}
    bodies = {}
    for i in range(len(eqns)):
        if sites.eqn_site[i] != FREE:
            bodies.setdefault((sites.eqn_site[i], sites.eqn_phase[i]), ([], []))[0].append(i)
    for d in defs:
        if d.var in read:
            bodies.setdefault((d.site, 0), ([], []))[1].append(d)
    produced = {v for e in eqns for v in e.outvars}
    if any(sites.site(v) == FREE and v in produced for v in outvars if not isinstance(v, Literal)):
        for s in range(num_stages):
            bodies.setdefault((s, 0), ([], []))
    order = sorted(bodies, key=lambda k: (k[1], k[0] == CROSS, k[0] if k[0] != CROSS else 0))
    return {k: bodies[k] for k in order}


def _program(key, eqns, sites: Sites, bodies, jaxpr) -> ApplyProgram:
    site, phase = key
    own, defs = bodies[key]
    defined = {v for i in own for v in eqns[i].outvars} | {d.var for d in defs}
    free_of = {v: i for i, e in enumerate(eqns) if sites.eqn_site[i] == FREE for v in e.outvars}
    stage0 = site != CROSS and phase == 0
    free_outs = [v for v in jaxpr.outvars if not isinstance(v, Literal) and v in free_of] if stage0 else []
    want = [v for i in own for v in in_vars(eqns[i])] + free_outs
    consts = set(jaxpr.constvars)
    run, inputs = set(own), []
    while want:
        v = want.pop()
        if v in defined or v in consts or v in inputs:
            continue
        if v in free_of:
            if free_of[v] not in run:
                run.add(free_of[v])
                want.extend(in_vars(eqns[free_of[v]]))
            continue
        inputs.append(v)
    parts = [k for d in defs for k in d.parts]
    return ApplyProgram(site, phase, [eqns[i] for i in sorted(run)], defs,
                        ([], [], list(reversed(inputs)) + parts), ([], [], list(dict.fromkeys(free_outs))))


def _fill_outputs(programs, jaxpr, sites: Sites) -> None:
    """Every program outputs what it defines that another program reads or the step returns
    (FREE step outputs: only the stages' phase-0 programs, which already list them)."""
    readers = _readers(programs)
    step_outs = {v for v in jaxpr.outvars if not isinstance(v, Literal)}
    for p in programs:
        mine = [v for e in p.eqns for v in e.outvars] + [d.var for d in p.defs]
        outs = [v for v in mine if sites.site(v) != FREE and (
            v in step_outs or any(q is not p for q in readers.get(v, ())))]
        p.outputs = ([], [], list(dict.fromkeys([*p.outputs[2], *outs])))


def _readers(programs) -> dict:
    readers = {}
    for p in programs:
        for k in p.flat_inputs:
            readers.setdefault(k, []).append(p)
    return readers


def _read_later_nearby(p, readers) -> bool:
    """Whether a program after ``p`` reads the value on devices ``p`` uses too (stages' submeshes
    are disjoint; the cross-stage program's mesh overlaps them all)."""
    later = readers[readers.index(p) + 1:]
    return any(q.site == p.site or CROSS in (q.site, p.site) for q in later)


def _pair_state(programs, jaxpr, sites: Sites, donated: set, ties: dict) -> None:
    """Split every program's state inputs/outputs (a step input and the step output that is its
    new value, both in the program) into donated and kept pairs. A donated input is donated by the
    last program reading it on the same devices (each stage donates its own replicas of a FREE
    value), and never when the step also returns it unchanged. A state input of the same stage that
    an earlier phase read is passed to the program making its new value as well."""
    index = {v: i for i, v in enumerate(jaxpr.invars)}
    for p in programs:
        for o, i in sorted(ties.items()):
            old = jaxpr.invars[i]
            if jaxpr.outvars[o] in p.outputs[2] and old not in p.inputs[2] and sites.site(old) == p.site:
                p.inputs[2].append(old)  # read in an earlier phase: also pass it here, to tie and donate
    readers = _readers(programs)
    returned = {v for v in jaxpr.outvars if not isinstance(v, Literal)}
    for p in programs:
        pairs = []
        for o, i in sorted(ties.items()):
            new, old = jaxpr.outvars[o], jaxpr.invars[i]
            if (new in p.outputs[2] and old in p.inputs[2]
                    and all(new is not a and old is not b for b, a in pairs)):
                pairs.append((old, new))
        donate = [(b, a) for b, a in pairs
                  if index[b] in donated and b not in returned and not _read_later_nearby(p, readers[b])]
        keep = [pr for pr in pairs if pr not in donate]
        paired_in, paired_out = {b for b, _ in pairs}, {a for _, a in pairs}
        p.inputs = ([b for b, _ in donate], [b for b, _ in keep], [k for k in p.inputs[2] if k not in paired_in])
        p.outputs = ([a for _, a in donate], [a for _, a in keep], [v for v in p.outputs[2] if v not in paired_out])
