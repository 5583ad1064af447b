"""The flat operator graph handed from the Python front end to the C++ core.

Contract (shared with ``cpp/include/alpa/graph.h``; the attrs layouts are decoded in one place,
``cpp/include/alpa/op_attrs.h``, bound as ``_core.decode_<family>_attrs``):

* One node per *result* of a StableHLO op (multi-result ops give one node per result, each
  with the op's operands).  Function arguments are ``PARAMETER`` nodes, ``func.return`` operands
  of the entry function are ``OUTPUT`` nodes.  Node ids are topological (operands before users).
* ``kind[v]``: an :class:`OpKind`.  ``attrs`` hold the kind-specific integers below.
* Shapes are static; ``dtype_bytes`` is the element size in bytes (i1 counts as 1).

Kind-specific ``attrs`` layouts (all int64):

==============  ================================================================================
PARAMETER       ``[arg_index]`` (flat index among the entry function's arguments)
OUTPUT          ``[output_index]`` (flat index among the entry function's results); 1 operand
GENERATOR       ``[]`` constant / iota: one replicated strategy, never constrained
ELEMENTWISE     ``[unshardable dims...]`` operands have the output's rank (same spec as output,
                dims may differ in size only in unshardable dims) or rank 0 (replicated).  Covers
                unary/binary/select/clamp/convert, slice, dynamic_slice, dynamic_update_slice,
                pad, concatenate, reverse, sort, reduce_window, optimization_barrier.
                dynamic_slice / dynamic_update_slice: ``[-1, runtime-indexed dims...]`` (the dims
                a runtime start moves; unshardable too, see cpp/include/alpa/unsafe_splits.h).
                A trailing ``-2, k``: the leading k dims are batch dims every operand of rank
                >= k shares whatever its rank (a custom call's ``sdy.sharding_rule`` batch factors).
BROADCAST       ``broadcast_dimensions`` (operand dim i -> output dim attrs[i])
TRANSPOSE       ``permutation`` (output dim i = operand dim attrs[i])
RESHAPE         ``[]`` (shapes say everything)
REDUCE          ``[reduced dims...]``; operands ``[input, init]`` (init is a scalar)
DOT             ``[nb, lhs_batch*nb, rhs_batch*nb, nc, lhs_contract*nc, rhs_contract*nc]``;
                output dims = batch, lhs free (in order), rhs free (in order)
CONVOLUTION     ``[in_batch, in_feature, ns, in_spatial*ns, k_in_feature, k_out_feature,
                k_spatial*ns, out_batch, out_feature, out_spatial*ns, feature_group_count,
                batch_group_count]``; operands ``[input, kernel]``
GATHER          ``[index_vector_dim, n, offset_dims*n, n, collapsed_slice_dims*n, n,
                start_index_map*n, n, operand_batching_dims*n, n, start_indices_batching_dims*n,
                n, slice_sizes*n]``; operands ``[operand, start_indices]``
SCATTER         ``[index_vector_dim, n, update_window_dims*n, n, inserted_window_dims*n, n,
                scatter_dims_to_operand_dims*n, n, input_batching_dims*n, n,
                scatter_indices_batching_dims*n]``; operands ``[input, scatter_indices, update]``
                (single-input scatters only; multi-input ones are OPAQUE)
OPAQUE          ``[]`` while/case/custom_call/rng/unknown ops: all operands and the result
                replicated.
==============  ================================================================================
"""
from __future__ import annotations

import dataclasses

import numpy as np

# The C++ enum (cpp/include/alpa/graph.h), bound once as an enum.IntEnum: OpKind.DOT == 8,
# OpKind(8) is OpKind.DOT, OpKind.DOT.name == "DOT".
from alpa_pass._core import OpKind

__all__ = ["CARRY_INDEX", "GraphBuilder", "OUTPUT_INDEX", "OpGraph", "OpKind", "OpLocator",
           "PARAM_INDEX"]

# ``OpLocator.op_index`` of nodes that are no op of their block: a function argument, a
# returned value, a while loop's carried slot (see OpLocator).
PARAM_INDEX, OUTPUT_INDEX, CARRY_INDEX = -1, -2, -3
# ``OpLocator.result`` of the node that stands for the reads of an op without results.
NO_RESULT = -1


@dataclasses.dataclass(frozen=True)
class OpLocator:
    """Where a node's value lives in the StableHLO module, for emission.

    ``func``: symbol name of the function that holds the op; ``op_index``: index of the op in that
    function's entry block (walk order of ``block.operations``); ``result``: result index.
    PARAMETER nodes use ``op_index = PARAM_INDEX`` (-1) and ``result`` = argument index of ``func``;
    OUTPUT nodes use ``op_index = OUTPUT_INDEX`` (-2) and ``result`` = result index; the loop-carried value of
    a ``stablehlo.while`` (its regions' block arguments) uses ``op_index = CARRY_INDEX`` (-3) and ``result`` =
    the carried slot (no op of its own: never constrained). An op without results that reads
    operands (a host callback of ``jax.debug.callback``) has one OPAQUE node of shape ``()`` with
    ``result = NO_RESULT``: its operands are read replicated (the plan pays the gather and emits it
    at the use, where XLA would otherwise rematerialize the value onto the callback's device); it
    has no value to constrain.
    ``nest``: for an op inside a region (a while's cond/body, a case's branch), the
    ``(op_index, region_index)`` pairs leading from ``func``'s entry block to the op's block;
    ``op_index`` then counts in that block.
    ``call_path``: tuple of (func, op_index) of the ``func.call`` ops that led here (empty for
    ``main``); a callee reached by several call paths gives several nodes for one MLIR value.
    """

    func: str
    op_index: int
    result: int
    call_path: tuple = ()
    nest: tuple = ()


@dataclasses.dataclass
class OpGraph:
    """Flat op graph. Arrays are numpy; ``*_offsets`` are CSR offsets of length ``num_nodes+1``."""

    kind: np.ndarray             # int32[N]   OpKind
    dtype_bytes: np.ndarray      # int32[N]
    shape_offsets: np.ndarray    # int64[N+1]
    shape_dims: np.ndarray       # int64[sum ranks]
    operand_offsets: np.ndarray  # int64[N+1]
    operand_ids: np.ndarray      # int64[sum operands], node ids < own id
    attr_offsets: np.ndarray     # int64[N+1]
    attrs: np.ndarray            # int64[...]
    op_names: list[str]          # e.g. "stablehlo.dot_general" (for people and logs)
    labels: list[str]            # short human label, e.g. "dot_general@mlp.py:12" or "arg0"
    locators: list[OpLocator]
    num_args: int = 0            # entry function arguments (PARAMETER nodes)
    num_outputs: int = 0         # entry function results (OUTPUT nodes)
    fallbacks: dict = dataclasses.field(default_factory=dict)  # op name -> count made OPAQUE
    donated_args: list = dataclasses.field(default_factory=list)  # flat entry-arg indices donated
    ties: list = dataclasses.field(default_factory=list)  # (node, node) whose specs must be equal (loop carries)
    weights: np.ndarray | None = None  # float64[N] cost factor per node (loop trip counts); None = all 1
    # float64[N] factor for a node's own communication in place of ``weights`` (a gradient dot that
    # a loop accumulates: its partial sums are reduced once after the loop); None = ``weights``
    comm_weights: np.ndarray | None = None

    @property
    def num_nodes(self) -> int:
        return int(self.kind.shape[0])

    def shape(self, v: int) -> tuple[int, ...]:
        return tuple(int(d) for d in self.shape_dims[self.shape_offsets[v]:self.shape_offsets[v + 1]])

    def operands(self, v: int) -> list[int]:
        return [int(u) for u in self.operand_ids[self.operand_offsets[v]:self.operand_offsets[v + 1]]]

    def node_attrs(self, v: int) -> list[int]:
        return [int(a) for a in self.attrs[self.attr_offsets[v]:self.attr_offsets[v + 1]]]

    def param_nodes(self) -> list[int]:
        """Node id of each entry argument, by argument index."""
        out = [-1] * self.num_args
        for v in np.nonzero(self.kind == OpKind.PARAMETER)[0]:
            out[self.node_attrs(int(v))[0]] = int(v)
        return out

    def output_nodes(self) -> list[int]:
        out = [-1] * self.num_outputs
        for v in np.nonzero(self.kind == OpKind.OUTPUT)[0]:
            out[self.node_attrs(int(v))[0]] = int(v)
        return out


class GraphBuilder:
    """Append nodes one at a time, then ``build()`` an :class:`OpGraph`."""

    def __init__(self):
        self._kind, self._bytes, self._shapes, self._ops, self._attrs = [], [], [], [], []
        self._names, self._labels, self._locs = [], [], []
        self.fallbacks: dict[str, int] = {}
        self.ties: list = []

    def add(self, kind: OpKind, shape, dtype_bytes: int, operands=(), attrs=(), *,
            op_name: str = "", label: str = "", locator: OpLocator | None = None) -> int:
        v = len(self._kind)
        for u in operands:
            if not 0 <= u < v:
                raise ValueError(f"operand {u} of node {v} ({op_name}) is not an earlier node")
        self._kind.append(int(kind))
        self._bytes.append(int(dtype_bytes))
        self._shapes.append([int(d) for d in shape])
        self._ops.append([int(u) for u in operands])
        self._attrs.append([int(a) for a in attrs])
        self._names.append(op_name)
        self._labels.append(label or op_name)
        self._locs.append(locator)
        return v

    def build(self, num_args: int = 0, num_outputs: int = 0) -> OpGraph:
        def csr(rows):
            offs = np.zeros(len(rows) + 1, dtype=np.int64)
            offs[1:] = np.cumsum([len(r) for r in rows])
            flat = np.array([x for r in rows for x in r], dtype=np.int64)
            return offs, flat

        so, sd = csr(self._shapes)
        oo, oi = csr(self._ops)
        ao, aa = csr(self._attrs)
        return OpGraph(kind=np.array(self._kind, dtype=np.int32),
                       dtype_bytes=np.array(self._bytes, dtype=np.int32),
                       shape_offsets=so, shape_dims=sd, operand_offsets=oo, operand_ids=oi,
                       attr_offsets=ao, attrs=aa, op_names=list(self._names),
                       labels=list(self._labels), locators=list(self._locs),
                       num_args=num_args, num_outputs=num_outputs, fallbacks=dict(self.fallbacks),
                       ties=list(self.ties))
