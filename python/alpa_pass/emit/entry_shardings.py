"""Put a plan's mesh and argument/result shardings on a module that has none (alpa-pass-opt).

``jax.jit(..., in_shardings=, out_shardings=)`` does this for the runtime; a ``.mlir`` file given
to ``alpa-pass-opt --auto-shard`` needs it done on the IR.
"""
from __future__ import annotations

from jaxlib.mlir import ir

from alpa_pass.emit.constraints import sharding_text
from alpa_pass.errors import EmitError


def ensure_mesh(module: ir.Module, mesh_name: str, axes: dict[str, int]) -> None:
    """Add ``sdy.mesh @mesh_name = <[...]>`` at the top of the module unless it exists (then the
    existing one must have the same axes)."""
    for op in module.body.operations:
        if op.operation.name == "sdy.mesh" and ir.StringAttr(op.attributes["sym_name"]).value == mesh_name:
            text = str(op.attributes["mesh"])
            want = "<[" + ", ".join(f'"{a}"={n}' for a, n in axes.items()) + "]>"
            if "".join(text.split()) != "".join(f"#sdy.mesh{want}".split()):
                raise EmitError(f"the module's sdy.mesh @{mesh_name} is {text}, but the plan is for "
                                f"{want}; pass --mesh-name to use another symbol")
            return
    body = ", ".join(f'"{a}"={n}' for a, n in axes.items())
    mesh_module = ir.Module.parse(f"sdy.mesh @{mesh_name} = <[{body}]>", module.context)
    first = module.body.operations[0] if len(module.body.operations) else None
    op = mesh_module.body.operations[0]
    op.operation.move_before(first) if first is not None else module.body.append(op)


def set_num_partitions(module: ir.Module, n: int) -> None:
    """Set ``mhlo.num_partitions`` (the SPMD partition count XLA compiles the module for)."""
    with module.context:
        module.operation.attributes["mhlo.num_partitions"] = ir.IntegerAttr.get(
            ir.IntegerType.get_signless(32), int(n))


def set_entry_shardings(module: ir.Module, entry: str, arg_dims: list, result_dims: list,
                        mesh_name: str) -> None:
    """Set ``sdy.sharding`` on each argument and result of ``entry`` (per-dim axis-name tuples)."""
    func = _find_func(module, entry)
    with module.context:
        func.attributes["arg_attrs"] = _with_sharding(func, "arg_attrs", arg_dims, mesh_name)
        func.attributes["res_attrs"] = _with_sharding(func, "res_attrs", result_dims, mesh_name)


def _with_sharding(func, name: str, dims_list: list, mesh_name: str) -> ir.ArrayAttr:
    old = list(ir.ArrayAttr(func.attributes[name])) if name in func.attributes else []
    out = []
    for k, dims in enumerate(dims_list):
        entries = {a.name: a.attr for a in ir.DictAttr(old[k])} if k < len(old) else {}
        entries["sdy.sharding"] = ir.Attribute.parse(sharding_text(dims, mesh_name))
        out.append(ir.DictAttr.get(entries))
    return ir.ArrayAttr.get(out)


def _find_func(module: ir.Module, name: str):
    for op in module.body.operations:
        if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == name:
            return op
    raise EmitError(f"the module has no function @{name}; pass --entry")
