"""Plans as JSON, and the checks that a saved plan fits the function and mesh it is applied to.

A plan file is one JSON object, one top-level key per line (the large per-node arrays last):

* header: ``format``, ``format_version``;
* ``mesh``: shape, axis names, alpha, beta (never devices: a plan is applied to any devices);
* ``input_specs`` / ``output_specs``: one ``PartitionSpec`` per leaf as a list of entries
  (``null`` = replicated dim, ``"x"`` = split over axis x, ``["x", "y"]`` = over x then y);
* every other plain-data field of :class:`~alpa_pass.plan.plan.Plan` under its own name
  (``fingerprint``, ``made_with`` = alpa_pass and jax versions and planning options,
  ``objective``, ``predicted``, ``ilp_size``, ``timings``, ``mesh_search``, ``node_specs``,
  ``operand_specs``, ...);
* ``axis_order``: mesh axis names, most major first: the order of the axes of a dim split over
  several (``Plan.axis_order``);
* ``choices``: per graph node, columns kind/label/shape/dtype_bytes/strategy/cost (the rows of
  ``Plan.summary()``; their ``PartitionSpec`` is rebuilt from ``node_specs``).
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile

import jax
import numpy as np

from alpa_pass._version import __version__
from alpa_pass.errors import PlanMismatchError
from alpa_pass.mesh import LogicalMesh

FORMAT = "alpa_pass.plan"
# 2: ``axis_order`` (the axis order of multi-axis dims in the leaf specs and in emission; version
# 1 files listed such dims in mesh order while emission ordered them otherwise: refused).
FORMAT_VERSION = 2

# Plan fields stored in their own form (everything else must be JSON-native data).
_SPECIAL_FIELDS = frozenset({"mesh", "choices", "input_specs", "output_specs", "emit_report"})
_CHOICE_COLUMNS = ("kind", "label", "shape", "dtype_bytes", "strategy", "cost")


def versions() -> dict:
    """{"alpa_pass": version, "jax": version} of this process."""
    return {"alpa_pass": __version__, "jax": jax.__version__}


def made_with(option) -> dict:
    """``Plan.made_with`` of a plan solved now with ``option``: versions and planning options."""
    return {**versions(), "options": option.planning_fields()}


def mesh_to_dict(mesh: LogicalMesh) -> dict:
    return {"shape": list(mesh.shape), "axis_names": list(mesh.axis_names),
            "alpha": list(mesh.alpha), "beta": list(mesh.beta)}


def mesh_differences(saved: LogicalMesh, mesh: LogicalMesh) -> list[str]:
    """What differs between two meshes' shape, axis names, alpha and beta (devices ignored)."""
    a, b = mesh_to_dict(saved), mesh_to_dict(mesh)
    return [f"{k} {a[k]} (plan) vs {b[k]} (mesh)" for k in a if a[k] != b[k]]


def plan_to_dict(plan) -> dict:
    """The JSON-ready dict of a Plan (see the module docstring for the layout)."""
    out = {"format": FORMAT, "format_version": FORMAT_VERSION, "mesh": mesh_to_dict(plan.mesh),
           "input_specs": [_spec_entries(s) for s in plan.input_specs],
           "output_specs": [_spec_entries(s) for s in plan.output_specs]}
    for f in dataclasses.fields(plan):
        if f.name not in _SPECIAL_FIELDS:
            out[f.name] = getattr(plan, f.name)
    out["choices"] = {"kind": [c.kind for c in plan.choices], "label": [c.label for c in plan.choices],
                      "shape": [list(c.shape) for c in plan.choices],
                      "dtype_bytes": [c.dtype_bytes for c in plan.choices],
                      "strategy": [c.strategy for c in plan.choices], "cost": [c.cost for c in plan.choices]}
    return out


def plan_to_json(plan) -> str:
    """JSON text of a Plan: valid JSON with one top-level key per line (diff- and grep-friendly)."""
    d = plan_to_dict(plan)
    lines = [f" {json.dumps(k)}: {json.dumps(v, default=_json_default)}" for k, v in d.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def plan_from_json(text: str | bytes, plan_cls, choice_cls):
    """Parse a plan file's text (or its bytes) into a ``plan_cls`` (``Plan``) with ``choice_cls``
    rows.

    Raises PlanMismatchError for what is not a plan this alpa_pass can read (not JSON text,
    another format or format version, missing fields or fields of another type)."""
    try:
        d = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PlanMismatchError(f"not an alpa_pass plan (invalid JSON: {e}); re-plan and save it again") from e
    return plan_from_dict(d, plan_cls, choice_cls)


def plan_from_dict(d, plan_cls, choice_cls):
    """Rebuild a ``plan_cls`` from :func:`plan_to_dict`'s dict (validates format and fields)."""
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise PlanMismatchError("not an alpa_pass plan (no 'format': 'alpa_pass.plan' header); "
                                "save plans with Plan.to_json() or Plan.save()")
    if d.get("format_version") != FORMAT_VERSION:
        raise PlanMismatchError(f"plan file format version {d.get('format_version')} but this alpa_pass "
                                f"reads version {FORMAT_VERSION}; re-plan with this alpa_pass and save again")
    try:
        mesh = LogicalMesh(shape=tuple(d["mesh"]["shape"]), alpha=tuple(d["mesh"]["alpha"]),
                           beta=tuple(d["mesh"]["beta"]), axis_names=tuple(d["mesh"]["axis_names"]))
        fields = {f.name: d[f.name] for f in dataclasses.fields(plan_cls)
                  if f.name not in _SPECIAL_FIELDS and (f.name in d or _required(f))}
        order = fields.get("axis_order", [])
        if order and (not isinstance(order, list) or sorted(map(str, order)) != sorted(mesh.axis_names)):
            raise ValueError(f"axis_order {order!r} is not an order of the mesh axes {list(mesh.axis_names)}")
        cols = d["choices"]
        rows = zip(*(cols[c] for c in _CHOICE_COLUMNS))
        choices = [choice_cls(node=v, kind=kind, label=label, shape=tuple(shape), dtype_bytes=int(nbytes),
                              spec=mesh.spec_to_partition_spec(fields["node_specs"][v], len(shape),
                                                                fields.get("axis_order", ())),
                              strategy=strategy, cost=float(cost))
                   for v, (kind, label, shape, nbytes, strategy, cost) in enumerate(rows)]
        input_specs = [_partition_spec(e) for e in d["input_specs"]]
        output_specs = [_partition_spec(e) for e in d["output_specs"]]
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise PlanMismatchError(f"alpa_pass plan file is incomplete or corrupt ({type(e).__name__}: {e}); "
                                f"re-plan and save it again") from e
    wrong = _wrong_types(fields)
    if wrong:
        raise PlanMismatchError(f"alpa_pass plan file is corrupt: {'; '.join(wrong)}; re-plan and save it again")
    if len(choices) != len(fields["node_specs"]) or len(fields["operand_specs"]) != len(choices):
        raise PlanMismatchError(f"alpa_pass plan file is corrupt: {len(choices)} choices, "
                                f"{len(fields['node_specs'])} node specs, {len(fields['operand_specs'])} "
                                f"operand specs; re-plan and save it again")
    return plan_cls(mesh=mesh, choices=choices, input_specs=input_specs, output_specs=output_specs, **fields)


# JSON type of each plain-data Plan field (a number is an int or a float).
_FIELD_TYPES = {"objective": (int, float), "predicted": dict, "node_specs": list, "operand_specs": list,
                "ilp_size": dict, "solve_time_s": (int, float), "solver_status": str, "mip_gap": (int, float),
                "timings": dict, "fallbacks": dict, "fingerprint": str, "made_with": dict, "origin": str,
                "mesh_search": list, "refinement": dict, "axis_order": list}


def _wrong_types(fields: dict) -> list[str]:
    """Fields (and ``made_with`` entries) whose JSON type is not the one plans are written with."""
    def name(t):
        return "number" if t == (int, float) else {dict: "object", list: "array", str: "string"}[t]

    wrong = [f"{k} is {type(v).__name__} {v!r:.40}, expected a JSON {name(_FIELD_TYPES[k])}"
             for k, v in fields.items() if k in _FIELD_TYPES and not isinstance(v, _FIELD_TYPES[k])]
    made_with = fields.get("made_with")
    if isinstance(made_with, dict):
        wrong += [f"made_with[{k!r}] is {made_with[k]!r:.40}, expected a JSON {name(t)}"
                  for k, t in (("jax", str), ("alpa_pass", str), ("options", dict))
                  if k in made_with and not isinstance(made_with[k], t)]
    return wrong


def check_applicable(plan, *, fingerprint: str, mesh: LogicalMesh, num_nodes: int) -> None:
    """Raise PlanMismatchError (saying what differs) unless ``plan`` was made by this jax for this
    function signature (``fingerprint``) and this mesh (shape, axis names, alpha, beta)."""
    here = versions()
    if plan.made_with.get("jax") != here["jax"]:
        raise PlanMismatchError(f"the saved plan was made with jax {plan.made_with.get('jax')} but this is "
                                f"jax {here['jax']}; lowerings differ between versions, so re-plan "
                                f"(drop ShardParallel(plan=...)) and save the new plan")
    if plan.fingerprint != fingerprint or len(plan.node_specs) != num_nodes:
        raise PlanMismatchError(f"the saved plan was made for another function signature (fingerprint "
                                f"{plan.fingerprint[:12]}, {len(plan.node_specs)} ops) than this one "
                                f"({fingerprint[:12]}, {num_nodes} ops): the code, argument shapes/dtypes "
                                f"or jax settings changed; re-plan (drop ShardParallel(plan=...)) and save it")
    diff = mesh_differences(plan.mesh, mesh)
    if diff:
        raise PlanMismatchError(f"the saved plan was made for another mesh: {'; '.join(diff)}; pass the "
                                f"plan's mesh (or mesh=None) or re-plan for this mesh")


def fit_problems(plan, graph) -> list[str]:
    """What in ``plan``'s specs does not fit ``graph`` (an ``extract.graph.OpGraph``) on
    ``plan.mesh``, one sentence each (empty: it fits): a node's core spec that is not one dim (or
    -1) per mesh axis, an operand spec count that differs from the node's operands, a leaf
    ``PartitionSpec`` naming an unknown axis, an axis twice or more dims than the leaf has, and
    any split that does not divide its dim."""
    mesh, out = plan.mesh, []
    for v in range(graph.num_nodes):
        out += _core_spec_problems(mesh, plan.node_specs[v], graph.shape(v), f"node %{v}")
        specs, ops = plan.operand_specs[v], graph.operands(v)
        if not isinstance(specs, list) or len(specs) != len(ops):
            out.append(f"node %{v} has {len(ops)} operands but its operand specs are {specs!r}")
            continue
        for t, (u, spec) in enumerate(zip(ops, specs)):
            out += _core_spec_problems(mesh, spec, graph.shape(u), f"operand {t} of node %{v}")
    for what, specs, nodes in (("argument", plan.input_specs, graph.param_nodes()),
                               ("output", plan.output_specs, graph.output_nodes())):
        if len(specs) != len(nodes):
            out.append(f"{len(specs)} {what} specs for {len(nodes)} {what} leaves")
            continue
        for i, (spec, v) in enumerate(zip(specs, nodes)):
            out += _leaf_spec_problems(mesh, spec, graph.shape(v), f"{what} leaf {i}")
    return out


def _core_spec_problems(mesh: LogicalMesh, spec, shape, where: str) -> list[str]:
    ok = isinstance(spec, list) and len(spec) == len(mesh.shape) and \
        all(isinstance(d, int) and -1 <= d < len(shape) for d in spec)
    if not ok:
        return [f"{where} {tuple(shape)}: core spec {spec!r} is not one dim in [-1, {len(shape)}) per mesh axis"]
    return _divides(mesh, mesh.dim_axes(spec, len(shape)), shape, where)


def _leaf_spec_problems(mesh: LogicalMesh, spec, shape, where: str) -> list[str]:
    dims = [() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in spec]
    axes = [a for d in dims for a in d]
    unknown = [a for a in axes if a not in mesh.axis_names]
    if len(dims) > len(shape) or unknown or len(set(axes)) != len(axes):
        return [f"{where} {tuple(shape)}: {spec} needs at most {len(shape)} entries naming each of the "
                f"mesh axes {mesh.axis_names} at most once"]
    return _divides(mesh, dims, shape, where)


def _divides(mesh: LogicalMesh, dims, shape, where: str) -> list[str]:
    out = []
    for dim, axes in enumerate(dims):
        n = int(np.prod([mesh.shape[mesh.axis_names.index(a)] for a in axes])) if axes else 1
        if shape[dim] % n:
            out.append(f"{where} {tuple(shape)}: dim {dim} split over {axes} ({n} devices), which does not "
                       f"divide {shape[dim]}")
    return out


def _required(field) -> bool:
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def _spec_entries(spec) -> list:
    return [list(e) if isinstance(e, tuple) else e for e in spec]


def _partition_spec(entries):
    from jax.sharding import PartitionSpec

    return PartitionSpec(*[tuple(e) if isinstance(e, list) else e for e in entries])


def _json_default(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, tuple):
        return list(x)
    raise TypeError(f"plan field value {x!r} ({type(x).__name__}) is not JSON data")


def write_atomic(path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory + ``os.replace``."""
    path = os.fspath(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".tmp_", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
