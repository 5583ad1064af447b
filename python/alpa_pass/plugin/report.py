"""``ALPA_PASS_REPORT``: each planned computation's summary (text) and main figures (JSON)."""
from __future__ import annotations

import json
import os
import re


def plan_figures(name: str, plan) -> dict:
    """The JSON-ready main figures of a plan: objective, predicted parts, ILP size, timings, specs."""
    return {
        "computation": name,
        "mesh": list(plan.mesh.shape),
        "objective": plan.objective,
        "predicted": dict(plan.predicted),
        "ilp_size": dict(plan.ilp_size),
        "solver_status": plan.solver_status,
        "mip_gap": plan.mip_gap,
        "timings": dict(plan.timings),
        "input_specs": [str(s) for s in plan.input_specs],
        "output_specs": [str(s) for s in plan.output_specs],
        "fallbacks": dict(plan.fallbacks),
        "constraints_inserted": getattr(plan.emit_report, "inserted", None),
        "origin": plan.origin,
        "mesh_search": [{k: (list(v) if isinstance(v, tuple) else v) for k, v in entry.items()}
                        for entry in (plan.mesh_search or [])],
    }


def write_report(directory: str, index: int, name: str, plan) -> tuple[str, str]:
    """Write ``<index>_<name>.txt`` (``plan.summary()``) and ``.json`` into ``directory`` (created).

    Returns the two paths."""
    os.makedirs(directory, exist_ok=True)
    stem = os.path.join(directory, f"{index:03d}_{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)[:80]}")
    with open(stem + ".txt", "w") as f:
        f.write(plan.summary())
    with open(stem + ".json", "w") as f:
        json.dump(plan_figures(name, plan), f, indent=2)
    return stem + ".txt", stem + ".json"
