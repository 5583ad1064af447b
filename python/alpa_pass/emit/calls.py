"""One callee per call path, so every value of a shared function can carry its own constraint.

jax lowers a function it calls several times (``jax.nn.relu``, any inner ``jax.jit``) to one
``func.func`` and several ``func.call``s. The graph has separate nodes per call path
(``OpLocator.call_path``) and the plan may want different layouts on them (a relu after a
column-parallel layer vs. after a row-parallel one), but one MLIR value takes one constraint:
emission used to leave such values unconstrained (``SKIP_CALL_PATHS``), Shardy then propagated a
layout from some other use, and XLA resharded the backward pass in ways the plan never costed
(Alpa's 2x2 MLP: 19 all-gathers and 5 all-to-alls instead of the planned all-reduces).

Input IR state: the module the graph's locators describe. Output IR state: the same module where
every call path the graph records reaches its own copy of the callee (``<name>_ap<k>``; the first
path keeps the original), and a graph copy whose locators name those copies. XLA inlines calls
before partitioning, so the copies change nothing else.

:func:`inline_calls` goes the other way: it copies callees' bodies into a block (a scan body's
``@closed_call`` into its while loop), for passes that match ops across the call
(:mod:`alpa_pass.emit.accumulation`).
"""
from __future__ import annotations

import dataclasses
import re

from jaxlib.mlir import ir

from alpa_pass.extract.graph import OpGraph
from alpa_pass.extract.stablehlo import functions

_NAME_LOC = re.compile(r'^loc\("((?:[^"\\]|\\.)*)"(?!:\d)')


def specialize_callees(module: ir.Module, graph: OpGraph) -> OpGraph:
    """Give each call path of ``graph`` its own callee in ``module`` (in place); returns ``graph``
    with locators naming the copies (``graph`` itself when no callee has two paths).

    A call op the path cannot name unambiguously (two ``func.call``s to the callee at the same
    index of different nested blocks of one caller) keeps the shared callee: its values stay
    unconstrained where the paths disagree, as before.
    """
    # A path's entries name the calling op by its index in its block, not by the block: two calls
    # at the same index of different nested blocks (two loop bodies) share a path, so a path is
    # keyed together with the function it reaches.
    keys = {(loc.call_path, loc.func) for loc in graph.locators if loc.call_path}
    paths_of: dict = {}
    for path, fname in keys:
        paths_of.setdefault(fname, []).append(path)
    if all(len(p) < 2 for p in paths_of.values()):
        return graph
    with module.context, ir.Location.unknown():
        name_of = _specialize(module, sorted(keys, key=lambda k: (len(k[0]), k)), paths_of)
    locators = [dataclasses.replace(loc, func=name_of.get((loc.call_path, loc.func), loc.func))
                if loc.call_path else loc for loc in graph.locators]
    return dataclasses.replace(graph, locators=locators)


def _specialize(module: ir.Module, keys: list, paths_of: dict) -> dict:
    """Clone and retarget, outer calls first; returns (call path, callee) -> the function that
    path now reaches."""
    funcs = functions(module)
    taken = set(funcs)
    name_of: dict = {}
    first_kept: set = set()
    for path, fname in keys:
        caller_name, index = path[-1]
        caller = name_of.get((path[:-1], caller_name), caller_name)
        if len(paths_of[fname]) < 2 or fname not in first_kept:
            first_kept.add(fname)
            name_of[(path, fname)] = fname
            continue
        new = _fresh_name(fname, taken)
        if _retarget(funcs, caller, index, fname, new) == new:
            funcs[new] = _clone_func(module, funcs[fname], new)
            taken.add(new)
        name_of[(path, fname)] = new if new in funcs else fname
    return name_of


def _fresh_name(fname: str, taken: set) -> str:
    k = 1
    while f"{fname}_ap{k}" in taken:
        k += 1
    return f"{fname}_ap{k}"


def _calls_at(op, index: int, callee: str) -> list:
    """``func.call @callee`` ops at position ``index`` of any block under ``op``."""
    found = []
    for region in op.regions:
        for block in region.blocks:
            ops = [o.operation for o in block.operations]
            if index < len(ops) and ops[index].name == "func.call" and \
                    ir.FlatSymbolRefAttr(ops[index].attributes["callee"]).value == callee:
                found.append(ops[index])
            for o in ops:
                if o.regions:
                    found.extend(_calls_at(o, index, callee))
    return found


def _retarget(funcs: dict, caller: str, index: int, callee: str, new: str) -> str:
    """Point the call at ``index`` of ``caller`` to ``new``; returns the callee the path now
    reaches (``callee`` when the call op is ambiguous)."""
    if new == callee or caller not in funcs:
        return callee
    calls = _calls_at(funcs[caller], index, callee)
    if len(calls) != 1:
        return callee
    calls[0].attributes["callee"] = ir.FlatSymbolRefAttr.get(new)
    return new


def _clone_func(module: ir.Module, func, name: str):
    """A private copy of ``func`` named ``name``, placed after it in ``module``."""
    clone = func.clone(ip=ir.InsertionPoint(module.body))
    clone.attributes["sym_name"] = ir.StringAttr.get(name)
    clone.attributes["sym_visibility"] = ir.StringAttr.get("private")
    return clone.operation if hasattr(clone, "operation") else clone


def inline_calls(block, funcs: dict) -> None:
    """Replace every ``func.call`` in ``block`` (and in the regions of its ops, at any depth) by
    a copy of the callee's body: jax puts a scan's body in ``@closed_call``, and the accumulator's
    add and yield must sit in one block. The callees stay (other callers may use them)."""
    for op in list(block.operations):
        op = op.operation
        if op.name == "func.call":
            callee = funcs[ir.FlatSymbolRefAttr(op.attributes["callee"]).value]
            body = callee.regions[0].blocks[0]
            mapping = dict(zip(body.arguments, op.operands))
            caller = _loc_name(op.location)
            with ir.InsertionPoint(op):
                for inner in body.operations:
                    inner = inner.operation
                    if inner.name == "func.return":
                        results = [mapping.get(v, v) for v in inner.operands]
                        break
                    new = inner.clone()
                    callee = _loc_name(inner.location)
                    if caller is not None and callee is not None:  # the HLO op_name XLA's own inlining gives
                        new.location = ir.Location.name(f"{caller}/{callee}", childLoc=inner.location)
                    _remap(new, mapping)
                    mapping.update(zip(inner.results, new.results))
            for old, new in zip(op.results, results):
                old.replace_all_uses_with(new)
            op.erase()
    for op in block.operations:  # the copies' own calls and nested regions, now in this block
        op = op.operation
        if op.name == "func.call":
            return inline_calls(block, funcs)
        for region in op.regions:
            for inner_block in region.blocks:
                inline_calls(inner_block, funcs)


def _loc_name(loc) -> str | None:
    """The name of a ``loc("name"(...))`` location (jax's name stack), or None."""
    m = _NAME_LOC.match(str(loc))
    return m.group(1) if m else None


def _remap(op, mapping: dict) -> None:
    """Point ``op``'s operands (and those of the ops in its regions) through ``mapping``."""
    for i, v in enumerate(op.operands):
        if v in mapping:
            op.operands[i] = mapping[v]
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                _remap(inner.operation, mapping)
