"""The on-disk plan cache (``AutoShardingOption.plan_cache_dir``).

One entry per (function signature fingerprint, mesh, planning options, alpa_pass and jax versions):
the plan's JSON in ``<dir>/<key>.json``, where ``key`` hashes those. A second process planning the
same step on the same mesh with the same options reads the entry instead of solving. An entry that
cannot be read, is not a plan, or was made for something else (a foreign or hand-edited file) is
reported with a warning and planned again (the new plan overwrites it). Entries are written
atomically, so concurrent processes never read half a file.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os

from alpa_pass.errors import PlanMismatchError
from alpa_pass.mesh import LogicalMesh
from alpa_pass.plan import serialize
from alpa_pass.plan.plan import Plan

log = logging.getLogger("alpa_pass")


def cache_key(fingerprint: str, mesh: LogicalMesh, option) -> str:
    """Hex name of the cache entry for this signature, mesh and planning options."""
    blob = json.dumps({"format_version": serialize.FORMAT_VERSION, "versions": serialize.versions(),
                       "fingerprint": fingerprint, "mesh": serialize.mesh_to_dict(mesh),
                       "options": option.planning_fields()}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:40]


def entry_path(cache_dir, fingerprint: str, mesh: LogicalMesh, option) -> str:
    return os.path.join(os.fspath(cache_dir), cache_key(fingerprint, mesh, option) + ".json")


def load_cached(cache_dir, fingerprint: str, mesh: LogicalMesh, option, graph):
    """The cached Plan for this signature/mesh/options of ``graph`` (the request's ``OpGraph``), or
    None (no entry, or a bad one: warned), e.g. an entry whose specs do not fit ``graph``.

    The returned plan's ``mesh`` is ``mesh`` (with its devices) and ``origin`` is "cache".
    """
    path = entry_path(cache_dir, fingerprint, mesh, option)
    try:
        with open(path, "rb") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        log.warning("alpa_pass: cannot read plan cache entry %s (%s); planning again", path, e)
        return None
    try:
        plan = Plan.from_json(text)
        serialize.check_applicable(plan, fingerprint=fingerprint, mesh=mesh, num_nodes=graph.num_nodes)
        options = option.planning_fields()
        if json.loads(json.dumps(options, default=str)) != plan.made_with.get("options"):
            raise PlanMismatchError(f"it was planned with options {plan.made_with.get('options')}, "
                                    f"not {options}")
        problems = serialize.fit_problems(plan, graph)
        if problems:
            raise PlanMismatchError(f"its specs do not fit: {problems[0]}")
    except PlanMismatchError as e:
        log.warning("alpa_pass: ignoring plan cache entry %s (corrupt or made for something else: %s); "
                    "planning again and overwriting it", path, e)
        return None
    plan.mesh, plan.origin = mesh, "cache"
    return plan


def store_cached(cache_dir, plan, option) -> str | None:
    """Write ``plan`` (planned with ``option``) as the entry for its fingerprint/mesh/options;
    returns the path, or None when the directory is not writable (warned: planning succeeded)."""
    path = entry_path(cache_dir, plan.fingerprint, plan.mesh, option)
    try:
        os.makedirs(os.fspath(cache_dir), exist_ok=True)
        serialize.write_atomic(path, plan.to_json())
    except OSError as e:
        log.warning("alpa_pass: cannot write plan cache entry %s (%s); the plan is not cached", path, e)
        return None
    return path
