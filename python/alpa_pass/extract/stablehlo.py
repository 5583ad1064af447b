"""StableHLO module -> :class:`OpGraph` (see :mod:`alpa_pass.extract.graph` for the contract).

The walk visits the entry function's block in order; ``func.call`` is inlined (each call path
gives its own nodes, recorded in ``OpLocator.call_path``).  Ops with regions are never entered:
reduce/sort/reduce_window/scatter/select_and_scatter are described by their rule, every other
region op (while, case, if, sdy.manual_computation, ...) is OPAQUE.  The op-name table lives in
:mod:`alpa_pass.extract.op_table`.
"""
from __future__ import annotations

import logging
import math
import os
import re

import numpy as np
from jaxlib.mlir import ir

from alpa_pass.errors import ExtractError
from alpa_pass import _compat
from alpa_pass.extract import op_table
from alpa_pass.extract.accumulators import accumulated_comm_weights
from alpa_pass.extract.graph import (CARRY_INDEX, NO_RESULT, OUTPUT_INDEX, PARAM_INDEX, GraphBuilder, OpGraph, OpKind,
                                     OpLocator)

_LOG = logging.getLogger("alpa_pass")
_FILE_LOC = re.compile(r'"([^"]+)":(\d+):\d+')
_NAME_LOC = re.compile(r'^loc\("((?:[^"\\]|\\.)*)"(?!:\d)')
_PARSER_BUFFER = "-"  # file name MLIR gives positions in parsed text: not a source location


def make_context() -> ir.Context:
    """An MLIR context with the func/stablehlo/chlo/sdy/mhlo dialects that jax modules use.

    jaxlib's public bindings register stablehlo/chlo/sdy but not ``func``; jax's own context
    factory is the one call that gives all of them.
    """
    return _compat.make_ir_context()


def parse_module(text: str, context: ir.Context | None = None) -> ir.Module:
    """Parse StableHLO text; raise ExtractError with MLIR's diagnostics when it does not parse."""
    ctx = context or make_context()
    try:
        return ir.Module.parse(text, ctx)
    except ir.MLIRError as e:
        raise ExtractError(f"could not parse the MLIR module: {e}") from e


def functions(module: ir.Module) -> dict:
    """Symbol name -> ``func.func`` operation, for every function in the module body."""
    out = {}
    for op in module.body.operations:
        if op.operation.name == "func.func":
            out[ir.StringAttr(op.attributes["sym_name"]).value] = op.operation
    return out


_SHARDING_MESH = re.compile(r"#sdy\.sharding<@([\w.$-]+)")


def drop_empty_mesh_constraints(module: ir.Module) -> int:
    """Remove ``sdy.sharding_constraint``s onto a mesh without axes (``@empty_mesh``); returns how many.

    jax adds them for typed PRNG key data (``jax.random.key``, ``nnx.Rngs``) when it lowers without
    shardings, and not when it lowers with them, so the module a plan is made from and the one it is
    emitted into would differ by these no-op ops. Input IR state: any module; output: the same
    module where each such constraint's uses read its operand and the constraint is erased.
    """
    empty = {ir.StringAttr(op.attributes["sym_name"]).value for op in module.body.operations
             if op.operation.name == "sdy.mesh" and "".join(str(op.attributes["mesh"]).split()) == "#sdy.mesh<[]>"}
    doomed = []

    def visit(op):
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    inner = inner.operation
                    mesh = _SHARDING_MESH.match(str(inner.attributes["sharding"])) \
                        if inner.name == "sdy.sharding_constraint" else None
                    if mesh is not None and mesh.group(1) in empty:
                        doomed.append(inner)
                    visit(inner)

    visit(module.operation)
    for op in doomed:
        op.results[0].replace_all_uses_with(op.operands[0])
        op.erase()
    return len(doomed)


def element_bytes(t: ir.Type) -> int:
    """Bytes per element (i1 and sub-byte types count as 1, complex counts both parts)."""
    if isinstance(t, ir.ComplexType):
        return 2 * element_bytes(t.element_type)
    if isinstance(t, (ir.IntegerType, ir.FloatType)):
        return max(1, (t.width + 7) // 8)
    if isinstance(t, ir.IndexType):
        return 8
    raise ExtractError(f"unsupported element type {t}; alpa_pass handles int, float and complex")


def source_label(op_name: str, location: ir.Location) -> str:
    """``short_name@file.py:line`` from the innermost file location, or the short name alone."""
    short = op_name.split(".", 1)[-1]
    for m in _FILE_LOC.finditer(str(location)):
        if m.group(1) != _PARSER_BUFFER:
            return f"{short}@{os.path.basename(m.group(1))}:{m.group(2)}"
    return short


# Trip count assumed for a while loop whose count is not a static ``i < N`` from a constant start
# (a data-dependent loop): its body's costs count this many times.
UNKNOWN_TRIP_COUNT = 8


def static_trip_count(op) -> int | None:
    """Iterations of a ``stablehlo.while`` that counts ``i`` from a constant to a constant
    (``cond: compare LT, i, N``, as jax lowers scan and fori_loop), or None."""
    ret = list(op.regions[0].blocks[0].operations)[-1]
    pred = ret.operands[0].owner if len(ret.operands) == 1 else None
    if pred is None or not hasattr(pred, "name") or pred.name != "stablehlo.compare" or \
            "LT" not in str(pred.attributes["comparison_direction"]):
        return None
    counter, bound = pred.operands
    try:
        counter = counter if isinstance(counter, ir.BlockArgument) else ir.BlockArgument(counter)
    except (ValueError, TypeError):  # not a block argument: not a counter
        return None
    start, stop = _int_constant(op.operands[counter.arg_number]), _int_constant(bound)
    return None if start is None or stop is None else max(0, stop - start)


def _int_constant(value) -> int | None:
    ints = op_table.constant_ints(value)
    return int(ints.reshape(-1)[0]) if ints is not None and ints.size == 1 else None


# jax.debug.print / debug.callback / pure_callback / io_callback targets (cpu and gpu, ffi or not)
HOST_CALLBACK = re.compile(r"python_(cpu|gpu)_callback")
QUIET_FALLBACK_BYTES = 64  # an op without a rule this small is counted, not warned about


def _call_target(op) -> str:
    attr = op.attributes["call_target_name"] if "call_target_name" in op.attributes else None
    return ir.StringAttr(attr).value if attr is not None else "?"


class _Walker:
    """Builds the graph for one extraction; holds the per-extraction caches and fallback log."""

    def __init__(self, funcs: dict):
        self.funcs = funcs
        self.builder = GraphBuilder()
        self._types: dict = {}
        self._info: list = []  # node id -> (shape, dtype_bytes)
        self._warned: set = set()  # op names warned about (no sharding rule)
        self.weights: list = []  # node id -> cost factor (product of enclosing trip counts)
        self._weight = 1.0
        self.loops: list = []  # (carry nodes, yield nodes, weight outside) per top-level while of the entry

    def add(self, kind, shape, nbytes, operands, attrs, **kw) -> int:
        self._info.append((shape, nbytes))
        self.weights.append(self._weight)
        return self.builder.add(kind, shape, nbytes, operands, attrs, **kw)

    def type_info(self, t: ir.Type, what: str) -> tuple:
        """(shape, dtype_bytes) of a result type; tokens and tuples give ((), 0)."""
        info = self._types.get(t)
        if info is None:
            if isinstance(t, ir.RankedTensorType):
                if not t.has_static_shape:
                    raise ExtractError(
                        f"{what} has the dynamic type {t}; alpa_pass needs static shapes: lower "
                        f"with concrete shapes (no shape polymorphism)")
                info = (tuple(t.shape), element_bytes(t.element_type))
            elif isinstance(t, ir.ShapedType):
                raise ExtractError(f"{what} has the unranked type {t}; shapes must be static")
            else:
                info = ((), 0)
            self._types[t] = info
        return info

    def fallback(self, name: str, nbytes: int = QUIET_FALLBACK_BYTES + 1) -> None:
        """Count an op without a rule; warn at the first one of ``name`` of more than
        QUIET_FALLBACK_BYTES (operands and results: smaller ones, such as the 16-byte key
        reinterpretations of jax's ``rbg`` generator, cannot cost a plan anything)."""
        fb, warned = self.builder.fallbacks, self._warned
        if name not in warned and nbytes > QUIET_FALLBACK_BYTES:
            warned.add(name)
            _LOG.warning("alpa_pass: no sharding rule for op '%s'; it will be computed replicated",
                         name)
        fb[name] = fb.get(name, 0) + 1

    def add_params(self, func_op) -> list[int]:
        block = func_op.regions[0].blocks[0]
        fname = ir.StringAttr(func_op.attributes["sym_name"]).value
        nodes = []
        for i, arg in enumerate(block.arguments):
            shape, nbytes = self.type_info(arg.type, f"argument {i} of @{fname}")
            m = _NAME_LOC.match(str(arg.location))
            nodes.append(self.add(
                OpKind.PARAMETER, shape, nbytes, (), (i,), op_name="parameter",
                label=m.group(1) if m else f"arg{i}", locator=OpLocator(fname, PARAM_INDEX, i)))
        return nodes

    def add_outputs(self, func_op, values: list[int]) -> None:
        fname = ir.StringAttr(func_op.attributes["sym_name"]).value
        res_attrs = func_op.attributes["res_attrs"] if "res_attrs" in func_op.attributes else None
        for i, v in enumerate(values):
            label = f"out{i}"
            if res_attrs is not None and "jax.result_info" in res_attrs[i]:
                label = ir.StringAttr(res_attrs[i]["jax.result_info"]).value
            shape, nbytes = self._info[v]
            self.add(OpKind.OUTPUT, shape, nbytes, (v,), (i,), op_name="output", label=label,
                     locator=OpLocator(fname, OUTPUT_INDEX, i))

    def walk(self, fname: str, arg_nodes: list[int], call_path: tuple) -> list[int]:
        """Add nodes for the body of ``fname``; return the node ids of its returned values."""
        func_op = self.funcs.get(fname)
        if func_op is None:
            raise ExtractError(f"func.call to @{fname}, which is not defined in the module")
        block = func_op.regions[0].blocks[0]
        out = self.walk_block(block, dict(zip(block.arguments, arg_nodes)), fname, (), call_path)
        if out is None:
            raise ExtractError(f"function @{fname} has no func.return")
        return out

    def walk_block(self, block, env: dict, fname: str, nest: tuple, call_path: tuple) -> list[int] | None:
        """Add nodes for the ops of ``block`` (``env``: MLIR value -> node, updated); return the
        nodes its terminator returns (None without one)."""
        for i, op in enumerate(block.operations):
            op = op.operation
            name = op.name
            ins = [env[v] for v in op.operands]
            if name in ("func.return", "stablehlo.return"):
                return ins
            if name == "func.call":
                callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
                outs = self.walk(callee, ins, call_path + ((fname, i),))
            elif name == "stablehlo.while":
                outs = self.walk_while(op, ins, env, OpLocator(fname, i, 0, call_path, nest))
            elif name == "stablehlo.case":
                outs = self.walk_case(op, ins, env, OpLocator(fname, i, 0, call_path, nest))
            else:
                outs = self.add_op(op, ins, OpLocator(fname, i, 0, call_path, nest))
            env.update(zip(op.results, outs))
        return None

    def walk_while(self, op, ins: list[int], env: dict, loc: OpLocator) -> list[int]:
        """A ``stablehlo.while``: its cond and body ops become nodes like top-level ops. Each
        carried slot k gets a carry node (identity of the init operand; what the regions' block
        argument k reads) and a result node (identity of the body's k-th yield), and
        carry == yield == result specs are tied: the loop carries one layout."""
        carry = [self.add(OpKind.ELEMENTWISE, *self._info[u], (u,), (), op_name="stablehlo.while", label=f"carry{k}",
                          locator=OpLocator(loc.func, CARRY_INDEX, k, loc.call_path, loc.nest))
                 for k, u in enumerate(ins)]
        yields, outer = None, self._weight
        trip = static_trip_count(op)
        self._weight = outer * (UNKNOWN_TRIP_COUNT if trip is None else trip)
        for r, region in enumerate(op.regions):  # 0: cond, 1: body
            block = region.blocks[0]
            out = self.walk_block(block, {**env, **dict(zip(block.arguments, carry))}, loc.func,
                                  loc.nest + ((loc.op_index, r),), loc.call_path)
            yields = out if r == 1 else yields
        self._weight = outer
        if yields is None or len(yields) != len(carry):
            raise ExtractError(f"stablehlo.while ({source_label(op.name, op.location)}) has no body "
                               f"yielding its {len(carry)} carried values")
        outs = self._results(op, [(y,) for y in yields], loc)
        for c, y, out in zip(carry, yields, outs):
            self.builder.ties += [(c, y), (out, y)]
        if not loc.nest and not loc.call_path:  # the loops emit.accumulation rewrites: main's own
            self.loops.append((carry, yields, outer))
        return outs

    def walk_case(self, op, ins: list[int], env: dict, loc: OpLocator) -> list[int]:
        """A ``stablehlo.case``: every branch's ops become nodes; result k is an elementwise
        node over the index and every branch's k-th returned value (one layout for all)."""
        rets = []
        for r, region in enumerate(op.regions):
            out = self.walk_block(region.blocks[0], dict(env), loc.func, loc.nest + ((loc.op_index, r),),
                                  loc.call_path)
            if out is None or len(out) != len(op.results):
                raise ExtractError(f"branch {r} of stablehlo.case ({source_label(op.name, op.location)}) "
                                   f"does not return its {len(op.results)} results")
            rets.append(out)
        return self._results(op, [(*ins, *(ret[k] for ret in rets)) for k in range(len(op.results))], loc)

    def _results(self, op, operands: list, loc: OpLocator) -> list[int]:
        label = source_label(op.name, op.location)
        outs = []
        for k, (res, ops) in enumerate(zip(op.results, operands)):
            shape, nbytes = self.type_info(res.type, f"op {op.name} ({label})")
            outs.append(self.add(OpKind.ELEMENTWISE, shape, nbytes, ops, (), op_name=op.name, label=label,
                                 locator=OpLocator(loc.func, loc.op_index, k, loc.call_path, loc.nest)))
        return outs

    def add_op(self, op, ins: list[int], loc: OpLocator) -> list[int]:
        name = op.name
        label = source_label(name, op.location)
        rule = op_table.lookup(name, len(op.regions) > 0)
        specs = rule(op, ins) if rule is not None else None
        if specs is None:
            if name == "stablehlo.custom_call":
                target = _call_target(op)
                if not HOST_CALLBACK.search(target):  # (a host callback runs where jax puts it: replicated)
                    self.fallback(f"{name} @{target}")
            else:
                sizes = [self._info[v] for v in ins] + [self.type_info(r.type, f"op {name} ({label})")
                                                        for r in op.results]
                self.fallback(name, sum(math.prod(shape) * nbytes for shape, nbytes in sizes))
            specs = op_table.opaque(op, ins)
        outs = []
        for k, (res, (kind, operands, attrs)) in enumerate(zip(op.results, specs)):
            shape, nbytes = self.type_info(res.type, f"op {name} ({label})")
            outs.append(self.add(
                kind, shape, nbytes, operands, attrs, op_name=name, label=label,
                locator=OpLocator(loc.func, loc.op_index, k, loc.call_path, loc.nest)))
        if not op.results and ins:  # a side effect reading values (a host callback): they are read whole
            self.add(OpKind.OPAQUE, (), 0, ins, (), op_name=name, label=label,
                     locator=OpLocator(loc.func, loc.op_index, NO_RESULT, loc.call_path, loc.nest))
        return outs


def extract_graph(module: ir.Module, entry: str = "main") -> OpGraph:
    """Extract the flat op graph of ``entry`` (calls inlined) from a StableHLO module (first
    removing jax's no-op constraints onto ``@empty_mesh``: :func:`drop_empty_mesh_constraints`).

    Raises:
      ExtractError: no function ``entry``, a dynamic/unranked shape, an undefined callee.
    Unknown ops become OPAQUE nodes, counted in ``graph.fallbacks`` and logged once per name.
    """
    drop_empty_mesh_constraints(module)
    funcs = functions(module)
    if entry not in funcs:
        raise ExtractError(f"module has no function @{entry} (functions: {sorted(funcs)}); "
                           f"pass entry= the name of the function to extract")
    w = _Walker(funcs)
    params = w.add_params(funcs[entry])
    results = w.walk(entry, params, ())
    w.add_outputs(funcs[entry], results)
    graph = w.builder.build(num_args=len(params), num_outputs=len(results))
    if any(x != 1.0 for x in w.weights):
        graph.weights = np.asarray(w.weights, dtype=np.float64)
        graph.comm_weights = accumulated_comm_weights(graph, w.loops)
    return graph
