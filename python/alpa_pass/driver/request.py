"""A plan request: everything that decides a plan, gathered once by each front door.

Every front door (``ShardParallel`` and the presets, pipeline stages, the plugin's lowering hook,
``alpa-pass-opt --auto-shard``) extracts its module to an ``OpGraph``, builds a ``PlanRequest``
with :meth:`PlanRequest.create` and hands it to ``driver.planning.plan_request``. The request's
``fingerprint`` (:func:`fingerprint`) identifies it for saved plans and the plan cache.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json

import jax

from alpa_pass import cost_profile
from alpa_pass.extract.graph import OpGraph
from alpa_pass.mesh import LogicalMesh
from alpa_pass.options import AutoShardingOption
from alpa_pass.plan.plan import Plan
from alpa_pass.runtime.multiprocess import broadcast_bytes
from alpa_pass.trace.lower import canonical_text, is_prng_key, leaf_aval, output_ties


@dataclasses.dataclass
class PlanRequest:
    """What to plan.

    Attributes:
      graph: the extracted OpGraph of the unsharded module (``graph.donated_args`` set).
      meshes: one LogicalMesh, or a tuple of candidates (the cheapest plan is kept).
      option: the planner options.
      ties: (node, node) pairs whose specs must be equal (outputs tied to the inputs they update).
      pins: (node, core spec) pairs: forced layouts (presets, pipeline parameters); an empty
        spec pins the node replicated on whatever mesh is planned.
      pinned_uses: pinned nodes whose users must read them in the pinned layout too (no
        resharding on their out-edges; ``FollowParallel``'s parameters).
      key_inputs / key_outputs: flat indices of argument / output leaves that are typed PRNG keys:
        planned replicated, and their specs in the plan are those of the key arrays (rank 0 for
        a scalar key), not of the key data the module carries.
      fingerprint: the request's identity (see :func:`fingerprint`); keys saved plans and the cache.
      name: the planned function's name (messages, logs).
      saved: a Plan to apply instead of solving (checked against the fingerprint and mesh).
      timings: seconds of the phases run before planning ("trace", "extract").
      axis_order: mesh axis names, most major first, for the plan's multi-axis dims (its entry
        shardings and emission), when they must match another plan's (``FollowParallel``,
        ``CreateStateParallel``); empty: the planner decides (``Plan.axis_order``).
    """

    graph: OpGraph
    meshes: LogicalMesh | tuple
    option: AutoShardingOption
    ties: tuple = ()
    pins: tuple = ()
    fingerprint: str = ""
    name: str = "fn"
    saved: Plan | None = None
    timings: dict = dataclasses.field(default_factory=dict)
    key_inputs: tuple = ()
    key_outputs: tuple = ()
    pinned_uses: tuple = ()
    axis_order: tuple = ()

    @classmethod
    def create(cls, graph: OpGraph, module_text: str, arg_avals, meshes, option: AutoShardingOption, *,
               out_avals=(), ties=(), pins=(), name: str = "fn", saved: Plan | None = None,
               timings=None, pinned_uses=(), axis_order=()) -> "PlanRequest":
        """A request whose fingerprint covers the module, the argument avals, the donated
        arguments (``graph.donated_args``), the pins, pinned uses and the cost profile
        (``option.profile``; "auto" is resolved here, once, to the current cluster's cached
        profile (process 0's in a job of several: :func:`agreed_profile`) or None; with a ``saved``
        plan made under unit costs, None). Typed PRNG key leaves among ``arg_avals`` /
        ``out_avals`` (flat) are pinned replicated."""
        key_inputs = tuple(i for i, a in enumerate(arg_avals) if is_prng_key(a))
        key_outputs = tuple(i for i, a in enumerate(out_avals) if is_prng_key(a))
        key_nodes = [graph.param_nodes()[i] for i in key_inputs] + [graph.output_nodes()[i] for i in key_outputs]
        pinned = {int(v): tuple(int(a) for a in s) for v, s in pins}
        pinned.update((int(v), ()) for v in key_nodes)
        ties, pins = (*ties, *graph.ties), tuple(sorted(pinned.items()))
        pinned_uses = tuple(sorted(int(v) for v in pinned_uses))
        axis_order = tuple(axis_order)

        def digest_with(profile):
            return fingerprint(module_text, arg_avals, graph.num_nodes, graph.donated_args, pins, pinned_uses,
                               axis_order, profile)

        if option.profile == "auto":
            profile = agreed_profile(cost_profile.resolve("auto"))
            if saved is not None and profile is not None and saved.fingerprint != digest_with(profile) \
                    and saved.fingerprint == digest_with(None):
                profile = None  # a plan saved under unit costs applies after `alpa-pass profile` too
            option = dataclasses.replace(option, profile=profile)
        digest = digest_with(option.profile)
        return cls(graph=graph, meshes=meshes, option=option, ties=ties, pins=pins, fingerprint=digest,
                   name=name, saved=saved, timings=dict(timings or {}), key_inputs=key_inputs,
                   key_outputs=key_outputs, pinned_uses=pinned_uses, axis_order=axis_order)


def agreed_profile(profile: cost_profile.ClusterProfile | None) -> cost_profile.ClusterProfile | None:
    """For ``profile="auto"``: ``profile`` (this process's cached profile of the cluster) in a
    single process; in a job of several, process 0's on every process (broadcast: ``alpa-pass
    profile`` writes it on process 0's host only, and a host without it, or with another, would
    otherwise plan differently and the plans diverge). A collective over all processes."""
    if jax.process_count() == 1:
        return profile
    mine = profile.to_json().encode() if profile is not None and jax.process_index() == 0 else b""
    text = broadcast_bytes(mine)
    return cost_profile.ClusterProfile.from_dict(json.loads(text), where="process 0's cached profile") \
        if text else None


def fingerprint(module_text: str, arg_avals, num_nodes: int, donated=(), pins=(), pinned_uses=(),
                axis_order=(), profile: cost_profile.ClusterProfile | None = None) -> str:
    """Identity of a plan request as the planner sees it (stable across processes).

    Args:
      module_text: the unsharded lowering's StableHLO without debug locations.
      arg_avals: the argument leaves (arrays, ``ShapeDtypeStruct``s, avals or Python scalars).
      num_nodes: node count of the extracted graph (ties the fingerprint to the extractor).
      donated: flat indices of donated argument leaves (donation changes memory liveness).
      pins: (node, core spec) pairs forced on the planner (presets, pipeline parameters).
      pinned_uses: pinned nodes whose users must read them as pinned (``PlanRequest.pinned_uses``).
      axis_order: an axis order imposed on the plan (``PlanRequest.axis_order``).
      profile: the measured cost profile planned with (its content digest), if any.
    """
    h = hashlib.sha256(canonical_text(module_text).encode())
    for a in map(leaf_aval, arg_avals):
        h.update(f"|{tuple(a.shape)}:{a.dtype}:{bool(getattr(a, 'weak_type', False))}".encode())
    h.update(f"|nodes={int(num_nodes)}|donated={sorted(int(i) for i in donated)}".encode())
    if pins:
        h.update(f"|pinned={[(int(v), list(s)) for v, s in pins]}".encode())
    if pinned_uses:
        h.update(f"|pinned_uses={sorted(int(v) for v in pinned_uses)}".encode())
    if axis_order:
        h.update(f"|axis_order={list(axis_order)}".encode())
    if profile is not None:
        h.update(f"|profile={profile.digest}".encode())
    return h.hexdigest()


def node_ties(graph: OpGraph, args, outputs) -> list[tuple[int, int]]:
    """(output node, parameter node) pairs of the output leaves that are new values of argument
    leaves (``trace.lower.output_ties`` on the pytrees ``args`` and ``outputs``)."""
    params, outs = graph.param_nodes(), graph.output_nodes()
    return [(outs[o], params[i]) for o, i in output_ties(args, outputs)]


def node_pins(graph: OpGraph, leaf_specs) -> list[tuple[int, list[int]]]:
    """(parameter node, core spec) for each argument leaf whose spec is not None."""
    params = graph.param_nodes()
    return [(params[i], list(s)) for i, s in enumerate(leaf_specs or ()) if s is not None]


def donated_leaves(args, donate_argnums) -> list[int]:
    """Flat indices into ``jax.tree.leaves(args)`` of the leaves of the positional arguments in
    ``donate_argnums`` (what the C++ core calls ``donated_args``)."""
    donate = set(donate_argnums)
    out, offset = [], 0
    for i, arg in enumerate(args):
        n = len(jax.tree.leaves(arg))
        if i in donate:
            out.extend(range(offset, offset + n))
        offset += n
    return out
