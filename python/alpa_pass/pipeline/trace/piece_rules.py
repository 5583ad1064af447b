"""Per-piece forms of step equations over stacked ``[L, ...]`` values (a table, one rule per family).

A stacked value cut along dim 0 into pieces ``[a, b)`` (``stacked_params``) keeps its pieces
through an equation when the equation computes each row of dim 0 from the same row of its stacked
operands only. Rules:

* ``"map"``: elementwise primitives (every operand a scalar or of the output's shape), a
  ``broadcast_in_dim`` of a scalar (or of a stacked value keeping dim 0), a reduction that keeps
  dim 0: run once per piece, each output is pieces again;
* ``"reduce"``: a reduction over dim 0 (``reduce_sum`` of a global norm): run once per piece, the
  partial results combined by the reduction's own operation (add, max, ...): a whole output.

Anything else reads the whole value (the pieces are concatenated for it).
"""
from __future__ import annotations

from jax import lax
from jax.extend.core import Literal

from alpa_pass import _compat

ELEMENTWISE = frozenset({
    "abs", "acos", "acosh", "add", "add_any", "and", "asin", "asinh", "atan", "atan2", "atanh", "cbrt",
    "ceil", "clamp", "convert_element_type", "copy", "copy_p", "cos", "cosh", "digamma", "div", "eq",
    "erf", "erf_inv", "erfc", "exp", "exp2", "expm1", "floor", "ge", "gt", "imag", "integer_pow",
    "is_finite", "le", "lgamma", "log", "log1p", "logistic", "lt", "max", "min", "mul", "ne", "neg",
    "nextafter", "not", "or", "pow", "real", "reduce_precision", "rem", "round", "rsqrt", "select_n",
    "shift_left", "shift_right_arithmetic", "shift_right_logical", "sign", "sin", "sinh", "sqrt",
    "square", "sub", "tan", "tanh", "xor",
})

# a reduction over dim 0, per piece, then the partial results combined with
REDUCE_COMBINE = {
    "reduce_sum": lax.add, "reduce_max": lax.max, "reduce_min": lax.min, "reduce_prod": lax.mul,
    "reduce_and": lax.bitwise_and, "reduce_or": lax.bitwise_or,
}


def rank(v) -> int:
    return len(getattr(v.aval, "shape", ()))


def is_stacked(v, length: int) -> bool:
    """Whether ``v`` (a jaxpr var, not a literal) has dim 0 of the stack's ``length``."""
    shape = getattr(v.aval, "shape", ())
    return not isinstance(v, Literal) and len(shape) >= 1 and shape[0] == length


def piece_rule(eqn, length: int) -> str | None:
    """``"map"``, ``"reduce"`` or None for ``eqn`` over stacks of ``length`` rows (module docstring)."""
    name, outs = eqn.primitive.name, eqn.outvars
    if name in ELEMENTWISE:
        shape = tuple(outs[0].aval.shape)
        if (shape and shape[0] == length and all(tuple(o.aval.shape) == shape for o in outs)
                and all(rank(v) == 0 or tuple(v.aval.shape) == shape for v in eqn.invars)):
            return "map"
        return None
    if name == "broadcast_in_dim":
        op, shape, dims = eqn.invars[0], tuple(eqn.params["shape"]), tuple(eqn.params["broadcast_dimensions"])
        if len(eqn.invars) == 1 and shape and shape[0] == length and (
                rank(op) == 0 or (is_stacked(op, length) and dims[0] == 0)):
            return "map"
        return None
    if name in REDUCE_COMBINE and len(eqn.invars) == 1 and is_stacked(eqn.invars[0], length):
        return "reduce" if 0 in tuple(eqn.params["axes"]) else "map"
    return None


def linked_vars(eqn, rule: str, length: int) -> list:
    """The vars a ``"map"`` equation keeps in one piece layout (its stacked operands and outputs)."""
    if rule != "map":
        return []
    return [v for v in eqn.invars if is_stacked(v, length)] + list(eqn.outvars)


def bind_piece(eqn, operands: list, rows: int):
    """``eqn`` bound on one piece's ``operands`` (``rows`` long); returns its outputs (a list)."""
    changes = {}
    if eqn.primitive.name == "broadcast_in_dim":
        changes["shape"] = (rows, *tuple(eqn.params["shape"])[1:])
    subfuns, params = _compat.bind_params(eqn, **changes)
    out = eqn.primitive.bind(*subfuns, *operands, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def combine(eqn, parts: list):
    """A ``"reduce"`` equation's result from its per-piece results, in piece order."""
    op = REDUCE_COMBINE[eqn.primitive.name]
    total = parts[0]
    for part in parts[1:]:
        total = op(total, part)
    return total


class PieceValues:
    """A jaxpr's values while it is evaluated again: whole (``env``) or in pieces (``pieces``: one
    per range, in order); each form is made from the other when first asked for (slices / a
    concatenation)."""

    def __init__(self, ranges):
        self.ranges, self.env, self.pieces = ranges, {}, {}
        self.lazy = {}  # var -> f(j): piece j, computed when first read

    def defer(self, eqn, rows) -> None:
        """Run the ``"map"`` equation ``eqn`` per piece only where a piece of an output is read
        (:meth:`piece`); ``rows``: per piece, its length."""
        done = {}

        def compute(j):
            if j not in done:
                done[j] = bind_piece(eqn, [self.operand(v, j) for v in eqn.invars], rows[j])
            return done[j]

        for k, v in enumerate(eqn.outvars):
            self.lazy[v] = lambda j, k=k: compute(j)[k]

    def piece(self, v, j: int):
        if v not in self.pieces and v in self.lazy:
            return self.lazy[v](j)
        return self.pieces_of(v)[j]

    def whole(self, v):
        if isinstance(v, Literal):
            return v.val
        if v not in self.env:
            parts = self.pieces[v] if v in self.pieces else [self.lazy[v](j) for j in range(len(self.ranges))]
            self.env[v] = lax.concatenate(parts, 0)
        return self.env[v]

    def pieces_of(self, v) -> list:
        if v not in self.pieces and v in self.lazy:
            self.pieces[v] = [self.lazy[v](j) for j in range(len(self.ranges))]
        elif v not in self.pieces:
            x = self.whole(v)
            self.pieces[v] = [lax.slice_in_dim(x, a, b, axis=0) for a, b in self.ranges]
        return self.pieces[v]

    def operand(self, v, j: int):
        """Operand ``v`` of a per-piece equation for piece ``j`` (a scalar: whole)."""
        return self.whole(v) if rank(v) == 0 else self.piece(v, j)
