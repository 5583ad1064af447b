"""``alpa-pass-opt``: run alpa_pass passes on a ``.mlir`` file and print the result.

  alpa-pass-opt FILE.mlir --extract              one line per graph node (see format_graph)
  alpa-pass-opt FILE.mlir --annotate SPECS.json  the module with sharding constraints inserted;
                                                 SPECS.json is {"node_id": [["x"], []], ...}

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

from alpa_pass.emit.constraints import insert_constraints
from alpa_pass.errors import AlpaPassError
from alpa_pass.extract.graph import OpGraph, OpKind
from alpa_pass.extract.stablehlo import extract_graph, parse_module


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
    where = f"at @{loc.func}:{loc.op_index}:{loc.result}"
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


PASSES: dict[str, Pass] = {
    "extract": Pass("print the extracted op graph, one line per node", None, _extract),
    "annotate": Pass("insert sdy.sharding_constraint ops from a JSON {node_id: dims} file",
                     "SPECS.json", _annotate),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="alpa-pass-opt", description=__doc__.splitlines()[0])
    p.add_argument("file", help="input .mlir file ('-' for stdin)")
    p.add_argument("--entry", default="main", help="entry function (default: main)")
    p.add_argument("--mesh-name", default="mesh", help="sdy.mesh symbol to shard over")
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
