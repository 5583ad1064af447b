"""
alpa_pass C++ core: meshes, specs, strategies, the sharding ILP (docs/core_api.md).
"""

from collections.abc import Sequence
import enum
from typing import Annotated, overload

import numpy
from numpy.typing import NDArray


class Mesh:
    """Logical N-D device mesh with alpha-beta costs per axis."""

    def __init__(self, shape: Sequence[int], alpha: Sequence[float], beta: Sequence[float], axes_costs: Sequence[tuple[Sequence[int], float, float]] = [], axis_order: Sequence[int] = []) -> None:
        """
        axes_costs: (axes, alpha, beta) of collectives over several axes at once (a measured
        flattened group), used instead of the largest per-axis alpha and beta.
        axis_order: mesh axes, most major first, in which a dim split over several axes lists
        them (empty: mesh order); reshard_cost charges the collective-permutes it implies.
        """

    @property
    def shape(self) -> list[int]: ...

    @property
    def axis_order(self) -> list[int]: ...

    @property
    def alpha(self) -> list[float]: ...

    @property
    def beta(self) -> list[float]: ...

    @property
    def all_gather_forbidden(self) -> bool:
        """
        Every all-gather over an axis of size > 1 costs 1e13 (Alpa's allow_all_gather=False).
        """

    @all_gather_forbidden.setter
    def all_gather_forbidden(self, arg: bool, /) -> None: ...

    @property
    def all_to_all_forbidden(self) -> bool:
        """
        Every all-to-all over an axis of size > 1 costs 1e13 (Alpa's allow_all_to_all=False).
        """

    @all_to_all_forbidden.setter
    def all_to_all_forbidden(self, arg: bool, /) -> None: ...

    @property
    def axes_costs(self) -> list[tuple[list[int], float, float]]: ...

    @property
    def ndim(self) -> int: ...

    @property
    def num_devices(self) -> int: ...

    def __repr__(self) -> str: ...

    def collective_permute(self, bytes: float, axes: Sequence[int]) -> float:
        """
        Every device sends `bytes` to another device of the axes' group: a + b B.
        """

    @overload
    def all_reduce(self, bytes: float, axis: int) -> float: ...

    @overload
    def all_reduce(self, bytes: float, axes: Sequence[int]) -> float: ...

    @overload
    def all_gather(self, bytes: float, axis: int) -> float: ...

    @overload
    def all_gather(self, bytes: float, axes: Sequence[int]) -> float: ...

    @overload
    def reduce_scatter(self, bytes: float, axis: int) -> float: ...

    @overload
    def reduce_scatter(self, bytes: float, axes: Sequence[int]) -> float: ...

    @overload
    def all_to_all(self, bytes: float, axis: int) -> float: ...

    @overload
    def all_to_all(self, bytes: float, axes: Sequence[int]) -> float: ...

    def combined_all_reduce(self, bytes: float, axes: Sequence[int], bucket_bytes: float) -> float:
        """
        An all-reduce XLA combines with others into one of bucket_bytes: its share of alpha
        (alpha * min(1, bytes / bucket_bytes)) plus the bandwidth term (mesh.h).
        """

def enumerate_specs(shape: Sequence[int], mesh: Mesh) -> list[list[int]]:
    """Every spec of `shape` on `mesh` whose splits divide the dims."""

def reshard_cost(mesh: Mesh, shape: Sequence[int], dtype_bytes: float, src_spec: Sequence[int], dst_spec: Sequence[int]) -> float:
    """
    Communication cost of moving a tensor from layout src_spec to dst_spec (spec.h).
    """

def spec_to_string(spec: Sequence[int], rank: int) -> str:
    """E.g. 'S0R', 'S01R', 'RR' (Alpa style)."""

class OpKind(enum.IntEnum):
    """Kind of a graph node (cpp/include/alpa/graph.h); an enum.IntEnum."""

    PARAMETER = 0

    OUTPUT = 1

    GENERATOR = 2

    ELEMENTWISE = 3

    BROADCAST = 4

    TRANSPOSE = 5

    RESHAPE = 6

    REDUCE = 7

    DOT = 8

    CONVOLUTION = 9

    GATHER = 10

    SCATTER = 11

    OPAQUE = 12

class ParameterAttrs:
    """The named fields of one op family's attrs (op_attrs.h)."""

    @property
    def arg_index(self) -> int: ...

def decode_parameter_attrs(attrs: Sequence[int]) -> ParameterAttrs:
    """
    The named fields of one node's attrs; ValueError naming the layout if malformed.
    """

class OutputAttrs:
    """The named fields of one op family's attrs (op_attrs.h)."""

    @property
    def output_index(self) -> int: ...

def decode_output_attrs(attrs: Sequence[int]) -> OutputAttrs:
    """
    The named fields of one node's attrs; ValueError naming the layout if malformed.
    """

class ElementwiseAttrs:
    """The named fields of one op family's attrs (op_attrs.h)."""

    @property
    def unshardable_dims(self) -> list[int]: ...

    @property
    def runtime_indexed_dims(self) -> list[int]: ...

    @property
    def batch_dims(self) -> int: ...

def decode_elementwise_attrs(attrs: Sequence[int]) -> ElementwiseAttrs:
    """
    The named fields of one node's attrs; ValueError naming the layout if malformed.
    """

class BroadcastAttrs:
    """The named fields of one op family's attrs (op_attrs.h)."""

    @property
    def broadcast_dims(self) -> list[int]: ...

def decode_broadcast_attrs(attrs: Sequence[int]) -> BroadcastAttrs:
    """
    The named fields of one node's attrs; ValueError naming the layout if malformed.
    """

class TransposeAttrs:
    """The named fields of one op family's attrs (op_attrs.h)."""

    @property
    def permutation(self) -> list[int]: ...

def decode_transpose_attrs(attrs: Sequence[int]) -> TransposeAttrs:
    """
    The named fields of one node's attrs; ValueError naming the layout if malformed.
    """

class ReduceAttrs:
    """The named fields of one op family's attrs (op_attrs.h)."""

    @property
    def reduced_dims(self) -> list[int]: ...

def decode_reduce_attrs(attrs: Sequence[int]) -> ReduceAttrs:
    """
    The named fields of one node's attrs; ValueError naming the layout if malformed.
    """

class DotAttrs:
    """The named fields of one op family's attrs (op_attrs.h)."""

    @property
    def lhs_batch(self) -> list[int]: ...

    @property
    def rhs_batch(self) -> list[int]: ...

    @property
    def lhs_contracting(self) -> list[int]: ...

    @property
    def rhs_contracting(self) -> list[int]: ...

def decode_dot_attrs(attrs: Sequence[int]) -> DotAttrs:
    """
    The named fields of one node's attrs; ValueError naming the layout if malformed.
    """

class ConvAttrs:
    """The named fields of one op family's attrs (op_attrs.h)."""

    @property
    def input_batch(self) -> int: ...

    @property
    def input_feature(self) -> int: ...

    @property
    def input_spatial(self) -> list[int]: ...

    @property
    def kernel_input_feature(self) -> int: ...

    @property
    def kernel_output_feature(self) -> int: ...

    @property
    def kernel_spatial(self) -> list[int]: ...

    @property
    def output_batch(self) -> int: ...

    @property
    def output_feature(self) -> int: ...

    @property
    def output_spatial(self) -> list[int]: ...

    @property
    def feature_group_count(self) -> int: ...

    @property
    def batch_group_count(self) -> int: ...

def decode_conv_attrs(attrs: Sequence[int]) -> ConvAttrs:
    """
    The named fields of one node's attrs; ValueError naming the layout if malformed.
    """

class GatherAttrs:
    """The named fields of one op family's attrs (op_attrs.h)."""

    @property
    def index_vector_dim(self) -> int: ...

    @property
    def offset_dims(self) -> list[int]: ...

    @property
    def collapsed_slice_dims(self) -> list[int]: ...

    @property
    def start_index_map(self) -> list[int]: ...

    @property
    def operand_batching_dims(self) -> list[int]: ...

    @property
    def start_indices_batching_dims(self) -> list[int]: ...

    @property
    def slice_sizes(self) -> list[int]: ...

def decode_gather_attrs(attrs: Sequence[int]) -> GatherAttrs:
    """
    The named fields of one node's attrs; ValueError naming the layout if malformed.
    """

class ScatterAttrs:
    """The named fields of one op family's attrs (op_attrs.h)."""

    @property
    def index_vector_dim(self) -> int: ...

    @property
    def update_window_dims(self) -> list[int]: ...

    @property
    def inserted_window_dims(self) -> list[int]: ...

    @property
    def scatter_dims_to_operand_dims(self) -> list[int]: ...

    @property
    def input_batching_dims(self) -> list[int]: ...

    @property
    def scatter_indices_batching_dims(self) -> list[int]: ...

def decode_scatter_attrs(attrs: Sequence[int]) -> ScatterAttrs:
    """
    The named fields of one node's attrs; ValueError naming the layout if malformed.
    """

class CoreOptions:
    """Options of the C++ core (see strategy.h)."""

    def __init__(self) -> None: ...

    @property
    def allow_replicated_heavy_ops(self) -> bool: ...

    @allow_replicated_heavy_ops.setter
    def allow_replicated_heavy_ops(self, arg: bool, /) -> None: ...

    @property
    def allow_mixed_mesh_shape(self) -> bool: ...

    @allow_mixed_mesh_shape.setter
    def allow_mixed_mesh_shape(self, arg: bool, /) -> None: ...

    @property
    def compute_cost_per_flop(self) -> float: ...

    @compute_cost_per_flop.setter
    def compute_cost_per_flop(self, arg: float, /) -> None: ...

    @property
    def compute_cost_per_flop_half(self) -> float: ...

    @compute_cost_per_flop_half.setter
    def compute_cost_per_flop_half(self, arg: float, /) -> None: ...

    @property
    def compute_cost_per_byte(self) -> float: ...

    @compute_cost_per_byte.setter
    def compute_cost_per_byte(self, arg: float, /) -> None: ...

    @property
    def memory_cost_per_byte(self) -> float: ...

    @memory_cost_per_byte.setter
    def memory_cost_per_byte(self, arg: float, /) -> None: ...

    @property
    def memory_budget_per_device(self) -> float: ...

    @memory_budget_per_device.setter
    def memory_budget_per_device(self, arg: float, /) -> None: ...

    @property
    def merge_followers(self) -> bool: ...

    @merge_followers.setter
    def merge_followers(self, arg: bool, /) -> None: ...

    @property
    def replicate_below_numel(self) -> int: ...

    @replicate_below_numel.setter
    def replicate_below_numel(self, arg: int, /) -> None: ...

    @property
    def tie_repeated_layers(self) -> bool: ...

    @tie_repeated_layers.setter
    def tie_repeated_layers(self, arg: bool, /) -> None: ...

    @property
    def all_reduce_combine_bytes(self) -> float: ...

    @all_reduce_combine_bytes.setter
    def all_reduce_combine_bytes(self, arg: float, /) -> None: ...

class Graph:
    """
    Flat op graph (CSR arrays, see extract/graph.py), copied and validated: ValueError naming the bad node.
    """

    def __init__(self, kind: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], dtype_bytes: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], shape_offsets: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], shape_dims: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], operand_offsets: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], operand_ids: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], attr_offsets: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], attrs: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> None: ...

    @property
    def num_nodes(self) -> int: ...

def node_flops(graph: Graph, v: int) -> float:
    """
    FLOPs of node v (dot: 2 * prod(result) * prod(contracting); convolution likewise; others: numel).
    """

class Strategy:
    """One sharding strategy of a node (strategy.h)."""

    @property
    def out(self) -> list[int]:
        """Spec of the result (mesh axis -> tensor dim, -1: none)."""

    @property
    def ins(self) -> list[list[int]]:
        """Required spec of each operand."""

    @property
    def compute(self) -> float: ...

    @property
    def comm(self) -> float: ...

    @property
    def memory(self) -> float: ...

    @property
    def name(self) -> str: ...

    def __repr__(self) -> str: ...

class NodeStrategies:
    @property
    def follow(self) -> int:
        """
        Operand node this node follows 1:1 (strategy k <-> the leader's k), or -1.
        """

    @property
    def strategies(self) -> list[Strategy]: ...

def combinable_reductions(graph: Graph, weights: Sequence[float] = []) -> list[bool]:
    """
    Per node: its all-reduce of partial sums is combined by XLA with others like it (no dot or
    convolution reachable from it, weight <= 1; strategy.h).
    """

def node_strategies(graph: Graph, v: int, mesh: Mesh, options: CoreOptions) -> NodeStrategies:
    """Strategies of node v (rules run on nodes 0..v; no merging)."""

class ShardingProblem:
    """Strategies of every node, flattened (S strategies), and the ILP."""

    @property
    def node_group(self) -> Annotated[NDArray[numpy.int64], dict(shape=(None,), writable=False)]:
        """int64[N]: the ILP group of each node."""

    @property
    def strategy_offsets(self) -> NDArray[numpy.int64]:
        """int64[N+1]: node v's strategies are rows [off[v], off[v+1])."""

    @property
    def out_specs(self) -> NDArray[numpy.int32]:
        """int32[S, mesh.ndim]: result spec of each strategy."""

    @property
    def in_spec_offsets(self) -> NDArray[numpy.int64]:
        """int64[S+1]: rows of in_specs per strategy (one per operand)."""

    @property
    def in_specs(self) -> NDArray[numpy.int32]:
        """int32[R, mesh.ndim]: operand specs of every strategy."""

    @property
    def compute_cost(self) -> NDArray[numpy.float64]:
        """
        float64[S]: compute cost of each strategy (weighted by compute_cost_per_flop).
        """

    @property
    def comm_cost(self) -> NDArray[numpy.float64]:
        """
        float64[S]: communication inside the op (e.g. all-reducing partial sums).
        """

    @property
    def memory(self) -> NDArray[numpy.float64]:
        """float64[S]: per-device bytes of the node's result in that layout."""

    @property
    def strategy_names(self) -> list[str]: ...

    @property
    def follow(self) -> NDArray[numpy.int64]:
        """int64[N]: leader operand node of each node, or -1."""

    @property
    def num_memory_rows(self) -> int:
        """
        Memory-budget rows (0 without a budget); not in ilp: ilp_with_memory_rows.
        """

    @property
    def memory_row_points(self) -> Annotated[NDArray[numpy.int64], dict(shape=(None,), writable=False)]:
        """int64[R]: the program point of each memory row (its maximal live set)."""

    @property
    def memory_row_upper(self) -> float:
        """
        Every memory row's upper bound (the budget the problem was built with).
        """

    def memory_row_activity(self, assignment: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> NDArray[numpy.float64]:
        """
        float64[R]: each memory row's activity under a strategy per group (memory.h).
        """

    def memory_row_lower_bound(self) -> float:
        """
        max over memory rows of the sum over groups of their least coefficient: no plan's peak is
        below it (0.0 without rows).
        """

    def memory_row_matrix(self, which: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)] | None = None) -> tuple[NDArray[numpy.int64], NDArray[numpy.int64], NDArray[numpy.float64]]:
        """
        (indptr, indices, data): the memory rows `which` (ascending indices; None: all)
        as CSR over the ILP's columns, columns ascending per row; ValueError for a bad index.
        """

    def ilp_with_memory_rows(self, which: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)] | None = None) -> IlpProblem:
        """
        ilp with the memory rows `which` (ascending indices; None: all) as its linear rows.
        """

    @property
    def live_nodes(self) -> Annotated[NDArray[numpy.int64], dict(shape=(None,), writable=False)]:
        """int64[L]: the values that count towards memory (memory.h)."""

    @property
    def live_start(self) -> Annotated[NDArray[numpy.int64], dict(shape=(None,), writable=False)]:
        """int64[L]: first program point (node) where each value is live."""

    @property
    def live_end(self) -> Annotated[NDArray[numpy.int64], dict(shape=(None,), writable=False)]:
        """int64[L]: last program point where each value is live (inclusive)."""

    @property
    def memory_constant(self) -> NDArray[numpy.uint8]:
        """
        uint8[N]: 1 where the node's value is a constant expression: never counted, nor any copy of it
        (memory.h).
        """

    @property
    def memory_points(self) -> Annotated[NDArray[numpy.int64], dict(shape=(None,), writable=False)]:
        """int64[P]: program points with a maximal live set."""

    def predicted_peak(self, assignment: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> tuple[float, int]:
        """
        (per-device peak bytes, node where reached) of a strategy per group, its reshard copies
        included (memory.h).
        """

    def reshard_copies(self, assignment: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> list[tuple[int, int, list[int], int, int, float]]:
        """
        [(consumer, operand, layout, start, end, bytes)]: the reshard copies of a strategy per
        group, one per consumer reading one (problem.h reshard_copies).
        """

    def copy_candidates(self, used: Annotated[NDArray[numpy.uint8], dict(shape=(None,), order='C', device='cpu', writable=False)], min_bytes: float) -> tuple:
        """
        (value, bytes, reader_start, readers, read_start, reads, has_start, has): the reshard copies a
        plan over the ILP columns with used != 0 (uint8 per column) can make, at least min_bytes
        global and per device; CSR arrays per candidate (problem.h copy_candidates).
        """

    @property
    def ilp(self) -> IlpProblem: ...

    @property
    def unpinned_uses(self) -> Annotated[NDArray[numpy.int64], dict(shape=(None,), writable=False)]:
        """
        int64[K]: nodes reading a pinned_uses node that no strategy lets read it as pinned.
        """

    @property
    def repeat_stats(self) -> dict:
        """
        Repeated-layer ties: regions, max_copies, repeated_nodes, classes_tied, classes_skipped, groups_before, groups_after (repeat.h).
        """

def build_sharding_problem(graph: Graph, mesh: Mesh, options: CoreOptions, ties: Sequence[tuple[int, int]] = [], donated_args: Sequence[int] = [], pinned: Sequence[tuple[int, Sequence[int]]] = [], pinned_uses: Sequence[int] = [], node_weights: Sequence[float] = [], comm_weights: Sequence[float] = [], copies: Sequence[tuple[int, int, Sequence[int], int, int]] = []) -> ShardingProblem:
    """
    ties: node pairs whose result specs must be equal.
    donated_args: flat entry-argument indices whose buffers may be reused.
    pinned: (node, spec) pairs; the node may only take strategies whose result spec equals
    spec (size-1 mesh axes ignored; an entry -2 leaves its axis free); ValueError if none
    does (problem.h).
    pinned_uses: pinned nodes whose users must read them in the pinned spec (no resharding
    on their out-edges); users that cannot are left free (unpinned_uses).
    node_weights: empty, or a cost factor >= 0 per node (a loop body's trip count).
    comm_weights: empty, or a factor >= 0 per node for its own communication cost in place
    of its node weight (a loop-accumulated gradient dot: reduced once after the loop).
    copies: (consumer, operand, layout, start, end) reshard copies the memory rows count
    when the consumer reads the operand in layout (reshard_copies of earlier plans).
    """

class IlpProblem:
    """The sharding ILP as HiGHS-ready CSC arrays (ilp.h)."""

    @property
    def num_cols(self) -> int: ...

    @property
    def num_rows(self) -> int: ...

    @property
    def offset(self) -> float: ...

    @property
    def num_edge_vars(self) -> int: ...

    @property
    def num_groups(self) -> int: ...

    @property
    def linear_row_start(self) -> int: ...

    @property
    def num_linear_rows(self) -> int: ...

    @property
    def col_cost(self) -> Annotated[NDArray[numpy.float64], dict(shape=(None,), writable=False)]: ...

    @property
    def col_lower(self) -> Annotated[NDArray[numpy.float64], dict(shape=(None,), writable=False)]: ...

    @property
    def col_upper(self) -> Annotated[NDArray[numpy.float64], dict(shape=(None,), writable=False)]: ...

    @property
    def integrality(self) -> Annotated[NDArray[numpy.int8], dict(shape=(None,), writable=False)]: ...

    @property
    def a_start(self) -> Annotated[NDArray[numpy.int64], dict(shape=(None,), writable=False)]: ...

    @property
    def a_index(self) -> Annotated[NDArray[numpy.int32], dict(shape=(None,), writable=False)]: ...

    @property
    def a_value(self) -> Annotated[NDArray[numpy.float64], dict(shape=(None,), writable=False)]: ...

    @property
    def row_lower(self) -> Annotated[NDArray[numpy.float64], dict(shape=(None,), writable=False)]: ...

    @property
    def row_upper(self) -> Annotated[NDArray[numpy.float64], dict(shape=(None,), writable=False)]: ...

    @property
    def group_var_start(self) -> Annotated[NDArray[numpy.int64], dict(shape=(None,), writable=False)]: ...

def build_ilp(group_costs: Sequence[Annotated[NDArray[numpy.float64], dict(shape=(None,), order='C', device='cpu', writable=False)]], edges: Sequence[tuple[int, int, Annotated[NDArray[numpy.float64], dict(order='C', device='cpu', writable=False)]]], equalities: Sequence[tuple[int, int, Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]]] = [], rows: Sequence[tuple[Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], Annotated[NDArray[numpy.float64], dict(shape=(None,), order='C', device='cpu', writable=False)], float, float]] = []) -> IlpProblem:
    """
    group_costs[g]: cost of each strategy of group g.
    edges: (u, v, cost[|S_u|, |S_v|]).
    equalities: (u, v, match): s_u = k forces s_v = match[k] (-1: forbids k).
    rows: (groups, strategies, coeffs, lower, upper) meaning
    lower <= sum_i coeffs[i] * s[groups[i]][strategies[i]] <= upper; they are the last
    num_linear_rows rows of the ILP (ilp.h).
    """

def min_max_row_problem(ilp: IlpProblem) -> IlpProblem:
    """
    Minimise M subject to every linear row <= M (costs zeroed; M is the last column).
    """

class EvalResult:
    @property
    def objective(self) -> float: ...

    @property
    def linear_cost(self) -> float: ...

    @property
    def edge_cost(self) -> float: ...

    @property
    def violations(self) -> list[str]: ...

    def __repr__(self) -> str: ...

def evaluate(ilp: IlpProblem, assignment: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> EvalResult:
    """
    Objective and violated rows of one strategy index per group (no solver).
    """

def one_group_changed(ilp: IlpProblem, assignment: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> NDArray[numpy.float64]:
    """
    float64 per s-column: the objective of the assignment with only that column's group changed
    to it (evaluate()'s objective, one pass; equalities and linear rows not checked).
    """

def evaluate_columns(ilp: IlpProblem, x: Annotated[NDArray[numpy.float64], dict(shape=(None,), order='C', device='cpu', writable=False)], tol: float = 1e-06) -> EvalResult:
    """
    Objective c.x + offset and violated bounds, rows and integrality of a column vector.
    """

def decode_assignment(ilp: IlpProblem, x: Annotated[NDArray[numpy.float64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> NDArray[numpy.int64]:
    """Strategy index per group (argmax of each group's columns)."""

def cluster_layers(flops: Annotated[NDArray[numpy.float64], dict(shape=(None,), order='C', device='cpu', writable=False)], cut_bytes: Annotated[NDArray[numpy.float64], dict(shape=(None,), order='C', device='cpu', writable=False)], layers: int, eps: float) -> list[int]:
    """
    Start indices of layers 1..layers-1 cutting the operators into layers (pipeline_dp.h).
    """

def stage_dp(cost: Annotated[NDArray[numpy.float64], dict(order='C', device='cpu', writable=False)], submesh_devices: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], num_devices: int, num_micro: int) -> tuple[float, float, list[tuple[int, int, int]]]:
    """
    cost[i, j, k]: latency of layers [i, j] on submesh choice k.
    Returns (objective, max stage latency, [(start, stop, submesh)]) (pipeline_dp.h).
    """

def structural_hashes(graph: Graph, rounds: int) -> NDArray[numpy.uint64]:
    """One WL hash per node after `rounds` refinement rounds (repeat.h)."""

def find_repeats(graph: Graph, region_rounds: int = 0, class_rounds: int = 6, stride: int = 2, anchor: bool = True) -> tuple[NDArray[numpy.int64], list[tuple[int, int, int]]]:
    """
    (node_class int64[N] (-1: none), [(start, stop, period)]) of the graph's tandem repeats.
    """
