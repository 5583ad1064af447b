"""Where each equation of the apply (the train step outside its gradient marker) runs.

Contract: ``assign_sites(eqns, seeds)`` takes the step's equations other than the
``grad_marker`` (in order) and ``seeds`` (var -> stage index: parameters, their gradients, the
loss and the aux values, on the stage that owns them), and returns
``Sites``: a site and a phase for every equation, a site for every var it reads or writes.

Sites:

* a stage index ``s``: the equation reads values of stage ``s`` only (besides FREE and CROSS
  values) and runs in an apply executable on stage ``s``'s submesh;
* ``CROSS``: the equation mixes values of several stages (global-norm clipping adds per-stage
  sums of squares; a metric summing every parameter). It runs in a cross-stage apply executable
  on the whole cluster mesh, which receives only the per-stage partial results those equations
  read, and sends its results back to the stages that read them;
* ``FREE``: the equation reads no stage value (a step counter, Adam's bias corrections). It is
  computed again in every executable that needs it; its inputs and outputs live replicated on
  every stage's devices (scalars: duplicating them costs nothing, moving them would).

Dataflow rule (Alpa's forward and reverse propagation, without duplicating stage work):
forward, an equation reading values of one stage runs there (unless it also reads CROSS values
at least as large: adding one more stage's partial sum to a cross-stage sum stays CROSS), of two
or more stages is CROSS;
backward, an equation (or an optimizer-state input such as Adam's ``mu``) reading no stage value
whose results are read on exactly one stage moves to that stage. Repeat to a fixed point; what
is left is CROSS when it reads a CROSS value, else FREE.

Phases order the executables: a stage equation reading a CROSS value of phase ``p`` runs in
phase ``p + 1``; executables run phase by phase, the stages' before the cross one. Without cross
equations every stage has exactly one apply executable (phase 0).
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict

from jax.extend.core import Literal

from alpa_pass.pipeline.partition.layers import var_bytes

CROSS = "cross"
FREE = "free"


@dataclasses.dataclass
class Sites:
    """Attributes: eqn_site / eqn_phase: per equation; var_site: var -> site (stage, CROSS or
    FREE) for every var read or written; var_phase: var -> phase of the executable defining it
    (0 for step inputs and marker outputs)."""

    eqn_site: list
    eqn_phase: list
    var_site: dict
    var_phase: dict

    def site(self, v):
        return FREE if isinstance(v, Literal) else self.var_site.get(v, FREE)


def in_vars(eqn) -> list:
    return [v for v in eqn.invars if not isinstance(v, Literal)]


def assign_sites(eqns, seeds: dict) -> Sites:
    """Sites and phases of ``eqns`` (see the module docstring). Step outputs never pull an
    equation onto a stage: only equations reading a value do."""
    site = dict(seeds)
    eqn_site = [None] * len(eqns)
    readers = defaultdict(list)
    for i, e in enumerate(eqns):
        for v in in_vars(e):
            readers[v].append(i)
    changed = True
    while changed:
        changed = _forward(eqns, eqn_site, site) | _backward(eqns, eqn_site, site, readers)
    for i, e in enumerate(eqns):
        if eqn_site[i] is None:
            eqn_site[i] = CROSS if any(site.get(v) == CROSS for v in in_vars(e)) else FREE
            site.update((v, eqn_site[i]) for v in e.outvars)
    for e in eqns:
        site.update((v, FREE) for v in in_vars(e) if v not in site)
    eqn_phase, var_phase = _phases(eqns, eqn_site, site)
    return Sites(eqn_site, eqn_phase, site, var_phase)


def _forward(eqns, eqn_site, site) -> bool:
    changed = False
    for i, e in enumerate(eqns):
        if eqn_site[i] is not None:
            continue
        stages = {site[v] for v in in_vars(e) if isinstance(site.get(v), int)}
        if stages:
            eqn_site[i] = stages.pop() if len(stages) == 1 and _stage_side_larger(e, site) else CROSS
            site.update((v, eqn_site[i]) for v in e.outvars)
            changed = True
    return changed


def _stage_side_larger(eqn, site) -> bool:
    """For an equation reading one stage's values and maybe CROSS ones: whether the stage's inputs
    outweigh the CROSS ones (ship the CROSS values to the stage), else it joins the cross region
    (a chain of adds over per-stage partial sums stays there instead of hopping between stages)."""
    stage = sum(var_bytes(v) for v in in_vars(eqn) if isinstance(site.get(v), int))
    cross = sum(var_bytes(v) for v in in_vars(eqn) if site.get(v) == CROSS)
    return cross == 0 or stage > cross


def _backward(eqns, eqn_site, site, readers) -> bool:
    """Pull stage-free equations and inputs onto the one stage that reads their results."""
    changed = False
    for i in reversed(range(len(eqns))):
        if eqn_site[i] is not None:
            continue
        s = _single_reader_stage([r for v in eqns[i].outvars for r in readers.get(v, ())], eqn_site)
        if s is not None:
            eqn_site[i] = s
            site.update((v, s) for v in eqns[i].outvars)
            changed = True
    for v, rs in readers.items():
        if v not in site:
            s = _single_reader_stage(rs, eqn_site)
            if s is not None:
                site[v] = s
                changed = True
    return changed


def _single_reader_stage(reader_eqns, eqn_site):
    sites = {eqn_site[r] for r in reader_eqns}
    if len(sites) == 1:
        (s,) = sites
        return s if isinstance(s, int) else None
    return None


def _phases(eqns, eqn_site, site):
    var_phase, eqn_phase = {}, []
    for i, e in enumerate(eqns):
        s, p = eqn_site[i], 0
        if s != FREE:
            for v in in_vars(e):
                sv = site.get(v, FREE)
                if sv == FREE:
                    continue
                p = max(p, var_phase.get(v, 0) + (1 if sv == CROSS and s != CROSS else 0))
            var_phase.update((v, p) for v in e.outvars)
        eqn_phase.append(p)
    return eqn_phase, var_phase
