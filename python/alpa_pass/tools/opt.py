"""``alpa-pass-opt``: run alpa_pass passes on a ``.mlir`` file and print the result.

  alpa-pass-opt FILE.mlir --extract              one line per graph node (see format_graph)
  alpa-pass-opt FILE.mlir --annotate SPECS.json  the module with sharding constraints inserted;
                                                 SPECS.json is {"node_id": [["x"], []], ...}
  alpa-pass-opt FILE.mlir --auto-shard 2x4 [--alpha 1,1] [--beta 1,0.1]
                                                 plan with the ILP and print the annotated module

Passes live in :data:`PASSES` (flag name -> :class:`Pass`); each is one ``--flag [VALUE]`` on the
command line and exactly one runs per invocation.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Callable, Optional

from jaxlib.mlir import ir

from alpa_pass.driver.planning import plan_request
from alpa_pass.driver.request import PlanRequest
from alpa_pass.emit.constraints import insert_constraints
from alpa_pass.emit.entry_shardings import ensure_mesh, set_entry_shardings, set_num_partitions
from alpa_pass.emit.plan_emission import emit_plan
from alpa_pass.errors import AlpaPassError
from alpa_pass.extract.graph import OpGraph, OpKind
from alpa_pass.extract.stablehlo import extract_graph, parse_module
from alpa_pass.mesh import LogicalMesh
from alpa_pass.options import AutoShardingOption


@dataclasses.dataclass(frozen=True)
class Pass:
    """A command-line pass.

    ``help``: one line for ``--help``.  ``metavar``: name of the flag's value, or None for a
    flag without one.  ``run(module, value, options)`` returns the text to print; ``options`` is
    the parsed argparse namespace (common options such as ``entry`` and ``mesh_name``).
    """

    help: str
    metavar: Optional[str]
    run: Callable[[ir.Module, Optional[str], argparse.Namespace], str]


def format_node(g: OpGraph, v: int) -> str:
    """``%id = kind op_name [shape]:bytesB (%operands) [attrs] label at @func:op:result [via ...]``.

    The ``at`` part is the node's locator; ``via @f:i`` lists the func.call ops that led there.
    """
    shape = "[" + ",".join(str(d) for d in g.shape(v)) + "]"
    operands = ", ".join(f"%{u}" for u in g.operands(v))
    attrs = ",".join(str(a) for a in g.node_attrs(v))
    kind = OpKind(int(g.kind[v])).name.lower()
    loc = g.locators[v]
    where = f"at @{loc.func}:" + "".join(f"{i}.r{r}/" for i, r in loc.nest) + f"{loc.op_index}:{loc.result}"
    where += "".join(f" via @{f}:{i}" for f, i in loc.call_path)
    return (f"%{v} = {kind} {g.op_names[v]} {shape}:{int(g.dtype_bytes[v])}B ({operands}) "
            f"[{attrs}] {g.labels[v]} {where}")


def format_graph(g: OpGraph) -> str:
    """A header comment, then one :func:`format_node` line per node."""
    fallbacks = ", ".join(f"{k}={n}" for k, n in sorted(g.fallbacks.items()))
    head = (f"// graph: {g.num_nodes} nodes, {g.num_args} args, {g.num_outputs} outputs, "
            f"fallbacks: {{{fallbacks}}}")
    return "\n".join([head] + [format_node(g, v) for v in range(g.num_nodes)])


def _extract(module: ir.Module, value: Optional[str], opts: argparse.Namespace) -> str:
    return format_graph(extract_graph(module, opts.entry))


def _load_specs(path: str) -> dict:
    with open(path) as f:
        raw = json.load(f)
    return {int(k): [tuple(d) for d in dims] for k, dims in raw.items()}


def _annotate(module: ir.Module, value: Optional[str], opts: argparse.Namespace) -> str:
    graph = extract_graph(module, opts.entry)
    report = insert_constraints(module, graph, _load_specs(value), opts.mesh_name)
    skipped = ", ".join(f"{k}={n}" for k, n in sorted(report.skipped.items()))
    return f"// inserted {report.inserted} constraints, skipped: {{{skipped}}}\n{module}"


def _mesh_floats(text: Optional[str], n: int, what: str):
    if text is None:
        return None
    vals = [float(x) for x in text.split(",")]
    if len(vals) != n:
        raise AlpaPassError(f"--{what} has {len(vals)} values for a {n}-axis mesh")
    return tuple(vals)


def _auto_shard(module: ir.Module, value: Optional[str], opts: argparse.Namespace) -> str:
    try:
        shape = tuple(int(x) for x in value.lower().split("x"))
    except ValueError:
        raise AlpaPassError(f"--auto-shard takes a mesh shape like 2x4, got {value!r}") from None
    mesh = LogicalMesh(shape=shape, alpha=_mesh_floats(opts.alpha, len(shape), "alpha"),
                       beta=_mesh_floats(opts.beta, len(shape), "beta"))
    graph = extract_graph(module, opts.entry)
    option = AutoShardingOption()
    request = PlanRequest.create(graph, module.operation.get_asm(enable_debug_info=False), [], mesh, option,
                                 name=opts.entry)
    plan = plan_request(request)
    ensure_mesh(module, opts.mesh_name, dict(zip(mesh.axis_names, mesh.shape)))
    set_num_partitions(module, mesh.num_devices)
    dims = [mesh.dim_axes(plan.node_specs[v], len(graph.shape(v)), plan.axis_order) for v in range(graph.num_nodes)]
    set_entry_shardings(module, opts.entry, [dims[v] for v in graph.param_nodes()],
                        [dims[v] for v in graph.output_nodes()], opts.mesh_name)
    report = emit_plan(module, graph, plan, option, mesh_name=opts.mesh_name, name=opts.entry)
    head = (f"// auto-shard: mesh {'x'.join(map(str, mesh.shape))}, objective {plan.objective:.6g}, "
            f"{report.inserted} constraints")
    return f"{head}\n{module}"


PASSES: dict[str, Pass] = {
    "extract": Pass("print the extracted op graph, one line per node", None, _extract),
    "annotate": Pass("insert sdy.sharding_constraint ops from a JSON {node_id: dims} file",
                     "SPECS.json", _annotate),
    "auto-shard": Pass("plan shardings with the ILP on a mesh like 2x4 and annotate the module",
                       "MESH", _auto_shard),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="alpa-pass-opt", description=__doc__.splitlines()[0])
    p.add_argument("file", help="input .mlir file ('-' for stdin)")
    p.add_argument("--entry", default="main", help="entry function (default: main)")
    p.add_argument("--mesh-name", default="mesh", help="sdy.mesh symbol to shard over")
    p.add_argument("--alpha", help="--auto-shard: per-axis latency, e.g. 1,1")
    p.add_argument("--beta", help="--auto-shard: per-axis cost per byte, e.g. 1,0.1")
    group = p.add_mutually_exclusive_group(required=True)
    for name, ps in PASSES.items():
        if ps.metavar is None:
            group.add_argument(f"--{name}", action="store_true", help=ps.help)
        else:
            group.add_argument(f"--{name}", metavar=ps.metavar, help=ps.help)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point; returns the exit status (0 ok, 1 an AlpaPassError, printed to stderr)."""
    opts = _parser().parse_args(argv)
    text = sys.stdin.read() if opts.file == "-" else open(opts.file).read()
    try:
        module = parse_module(text)
        for name, ps in PASSES.items():
            value = getattr(opts, name.replace("-", "_"))
            if value not in (None, False):
                print(ps.run(module, None if value is True else value, opts))
    except AlpaPassError as e:
        print(f"alpa-pass-opt: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
