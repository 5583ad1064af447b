"""Cut stacked ``[L, ...]`` parameters, their gradients and optimizer state into per-piece step leaves.

After ``scan_split`` cuts the loss's layer stack into one scan per piece ``[a, b)``, each piece
reads ``xs[a:b]`` of the stacked parameters; the stack itself is still one step input, owned by
one stage, its gradient summed and its optimizer state updated there. This pass rewrites the step
so that every stage holds only its pieces:

* **loss** (``piece_loss``): a marker input read only through the pieces' slices (``xs[a:b]``
  within one piece, maybe after row-wise ``"map"`` equations such as a cast) becomes one marker
  input per piece; every other marker input stays whole (a stack the loss also reads whole keeps
  the single-owner path);
* **step inputs**: those stacked parameters, and every step input the optimizer update combines
  with them row by row (Adam's ``mu``/``nu``), become one step leaf per piece;
* **apply** (split propagation): an equation with a per-piece form (``piece_rules``: elementwise,
  broadcasts of scalars, reductions) whose stacked operands are in a piece layout runs once per
  piece, so each piece's update reads only that piece (``apply_sites`` then places it on the
  stage owning the piece); a reduction over dim 0 becomes per-piece reductions combined (a
  cross-stage sum of per-stage partial sums); anything else reads the pieces concatenated;
* **step outputs**: a value in pieces is returned as its pieces (``run.stacked`` joins them
  into one ``[L, ...]`` array for the user).

Which vars are in pieces: those connected by ``"map"`` equations to a split parameter or its
gradient (a union-find over the apply's equations); step inputs in such a group are cut.

Contract: ``split_stacked_params(traced, bounds)`` returns ``(traced', split)``: ``traced'`` a
TracedStep of the same step over the split leaves (its ``out_tree`` flat over the split outputs),
``split`` the ``StackSplit`` mapping the user's leaves to them; ``(traced, None)`` when no marker
input is read only through the pieces. The pieces are ``bounds``' ranges: first one per scan
piece; ``compile.pipeshard`` merges those one stage holds once the stages are known.
"""
from __future__ import annotations

import dataclasses

import jax
from jax.extend.core import ClosedJaxpr, Literal, jaxpr_as_fun

from alpa_pass.pipeline.trace import piece_loss, piece_rules
from alpa_pass.pipeline.trace.markers import grad_marker_p
from alpa_pass.pipeline.trace.step import TracedStep, eval_eqns, num_aux


@dataclasses.dataclass(frozen=True)
class StackSplit:
    """How a step's stacked leaves map to per-piece leaves.

    Attributes:
      bounds: piece boundaries along dim 0, ``(0, b1, ..., L)``.
      inputs: per split-step input leaf, ``(user leaf index, piece index or None for a whole leaf)``.
      outputs: per user output leaf, the indices of its split-step outputs (one: whole; one per
        piece: its pieces in order).
      out_tree: the user's output treedef.
      marker_pieces: the positions of the (original) marker inputs cut into pieces.
    """

    bounds: tuple
    inputs: tuple
    outputs: tuple
    out_tree: object
    marker_pieces: tuple = ()

    @property
    def ranges(self) -> list:
        return list(zip(self.bounds[:-1], self.bounds[1:]))

    def leaves_of(self) -> dict:
        """user leaf index -> its split-step leaf indices (one, or one per piece)."""
        out = {}
        for j, (i, _) in enumerate(self.inputs):
            out.setdefault(i, []).append(j)
        return out

    def map_ties(self, ties: dict) -> dict:
        """User (output leaf -> input leaf) ties as split-step ties: piece to piece, whole to whole
        (an input cut into pieces whose new value is whole is not tied)."""
        leaves, out = self.leaves_of(), {}
        for o, i in ties.items():
            if len(self.outputs[o]) == len(leaves[i]):
                out.update(zip(self.outputs[o], leaves[i]))
        return out

    def map_leaves(self, indices) -> set:
        """User leaf indices as split-step leaf indices (every piece of a cut leaf)."""
        leaves = self.leaves_of()
        return {j for i in indices for j in leaves[i]}

    def split_avals(self, traced: TracedStep) -> list:
        """The split step's input leaves as ShapeDtypeStructs."""
        return [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type)
                for v in traced.step.jaxpr.invars]


def split_stacked_params(traced: TracedStep, bounds, loss: ClosedJaxpr | None = None
                         ) -> tuple[TracedStep, StackSplit | None]:
    """See the module contract. ``bounds``: the pieces' boundaries ``(0, ..., L)``; the loss's
    slices must each lie within one piece. ``loss``: the loss over the pieces when already built
    (``piece_loss.merge_pieces``); by default :func:`piece_loss.piece_loss`."""
    bounds = tuple(int(b) for b in bounds)
    ranges = list(zip(bounds[:-1], bounds[1:]))
    length = bounds[-1]
    piece_read, chain = piece_loss.piece_read_inputs(traced.loss, traced.batch_mask, ranges)
    marker = traced.marker
    # a step input is split only when every marker input it feeds is read through the pieces
    fed = {}
    for k, v in enumerate(marker.invars):
        fed.setdefault(v, []).append(k)
    params = {v for v, ks in fed.items() if all(k in piece_read for k in ks)}
    if not params:
        return traced, None
    split_k = {k for v in params for k in fed[v]}
    eqns = [e for e in traced.step.jaxpr.eqns if e is not marker]
    grads = _grad_vars(traced)
    seeds = list(params) + [grads[k] for k in split_k if k in grads]
    rules, in_pieces = _propagate(eqns, seeds, length)
    cut = [v for v in traced.step.jaxpr.invars if v in params or (v not in fed and v in in_pieces)]
    if loss is None:
        loss = piece_loss.piece_loss(traced.loss, split_k, chain, ranges)
    return _rewrite(traced, ranges, set(cut), split_k, rules, in_pieces, loss)


def _grad_vars(traced: TracedStep) -> dict:
    """marker input position -> the marker output that is its gradient."""
    outs = traced.marker.outvars[1 + num_aux(traced.info):]
    diff = [k for k, d in enumerate(traced.info.diff_mask) if d]
    return dict(zip(diff, outs))


def _propagate(eqns, seeds, length: int) -> tuple[dict, set]:
    """(equation index -> "map"/"reduce" for the equations run per piece, vars in piece groups):
    groups are vars linked by "map" equations; those holding a seed are in pieces."""
    parent = {}

    def find(v):
        while parent.get(v, v) is not v:
            parent[v] = parent.get(parent[v], parent[v])
            v = parent[v]
        return v

    rule_of, seen = {}, set(seeds)
    for i, e in enumerate(eqns):
        rule = piece_rules.piece_rule(e, length)
        if rule is None:
            continue
        rule_of[i] = rule
        linked = piece_rules.linked_vars(e, rule, length)
        seen.update(linked)
        for v in linked[1:]:
            a, b = find(linked[0]), find(v)
            if a is not b:
                parent[b] = a
    roots = {find(s) for s in seeds}
    in_pieces = {v for v in seen if find(v) in roots}
    rules = {}
    for i, rule in rule_of.items():
        anchor = eqns[i].outvars[0] if rule == "map" else eqns[i].invars[0]
        if find(anchor) in roots:
            rules[i] = rule
    return rules, in_pieces


def _rewrite(traced: TracedStep, ranges, cut: set, split_k: set, rules: dict, in_pieces: set, loss):
    step, marker, n = traced.step.jaxpr, traced.marker, len(ranges)
    rows = [b - a for a, b in ranges]
    info = _piece_info(traced, split_k, n, loss)
    inputs, user_avals = [], []
    for i, v in enumerate(step.invars):
        for j in (range(n) if v in cut else (None,)):
            inputs.append((i, j))
            shape = tuple(v.aval.shape) if j is None else (rows[j], *v.aval.shape[1:])
            user_avals.append(jax.ShapeDtypeStruct(shape, v.aval.dtype, weak_type=v.aval.weak_type))
    eqn_index = {id(e): i for i, e in enumerate(e for e in step.eqns if e is not marker)}
    outputs = []

    def run(*flat):
        vals = piece_rules.PieceValues(ranges)
        vals.env.update(zip(step.constvars, traced.step.consts))
        it = iter(flat)
        for v in step.invars:
            if v in cut:
                vals.pieces[v] = [next(it) for _ in range(n)]
            else:
                vals.env[v] = next(it)
        for e in step.eqns:
            if e is marker:
                _run_marker(e, vals, split_k, info, n)
                continue
            _run_eqn(e, rules.get(eqn_index[id(e)]), vals, rows)
        out = []
        outputs.clear()
        for v in step.outvars:
            parts = vals.pieces.get(v) if not isinstance(v, Literal) and v in in_pieces else None
            outputs.append(tuple(range(len(out), len(out) + (n if parts else 1))))
            out.extend(parts if parts else [vals.whole(v)])
        return out

    new_step = jax.make_jaxpr(run)(*user_avals)
    new_marker = next(e for e in new_step.jaxpr.eqns if e.primitive is grad_marker_p)
    split = StackSplit(tuple([ranges[0][0]] + [b for _, b in ranges]), tuple(inputs), tuple(outputs),
                       traced.out_tree, tuple(sorted(split_k)))
    marker_arg, batch_mask = _marker_args(traced, split)
    out_tree = jax.tree.structure(tuple(range(len(new_step.jaxpr.outvars))))
    return TracedStep(new_step, out_tree, new_marker, info, marker_arg, batch_mask, loss), split


def _marker_args(traced: TracedStep, split: StackSplit) -> tuple[list, list]:
    """The split step's ``marker_arg`` and ``batch_mask`` (a cut marker input: one per piece)."""
    leaves = split.leaves_of()
    marker_arg, batch_mask = [], []
    for k, i in enumerate(traced.marker_arg):
        ks = leaves[i] if k in split.marker_pieces else leaves[i][:1]
        marker_arg += ks
        batch_mask += [traced.batch_mask[k]] * len(ks)
    return marker_arg, batch_mask


def _run_eqn(eqn, rule, vals, rows) -> None:
    """Evaluate one apply equation: per piece (``rule`` "map"), per piece then combined
    ("reduce"), or on whole values (None)."""
    if rule == "map":
        outs = [piece_rules.bind_piece(eqn, [vals.operand(v, j) for v in eqn.invars], r) for j, r in enumerate(rows)]
        for k, v in enumerate(eqn.outvars):
            vals.pieces[v] = [o[k] for o in outs]
    elif rule == "reduce":
        parts = [piece_rules.bind_piece(eqn, [x], r)[0] for x, r in zip(vals.pieces_of(eqn.invars[0]), rows)]
        vals.env[eqn.outvars[0]] = piece_rules.combine(eqn, parts)
    else:
        for v in eqn.invars:
            vals.whole(v)
        eval_eqns([eqn], vals.env)


def _run_marker(eqn, vals, split_k: set, info, n: int) -> None:
    ins = []
    for k, v in enumerate(eqn.invars):
        ins += vals.pieces_of(v) if k in split_k else [vals.whole(v)]
    outs = iter(grad_marker_p.bind(*ins, info=info))
    n_aux = num_aux(info)
    for v in eqn.outvars[:1 + n_aux]:
        vals.env[v] = next(outs)
    diff = [k for k, d in enumerate(eqn.params["info"].diff_mask) if d]
    for k, v in zip(diff, eqn.outvars[1 + n_aux:]):
        if k in split_k:
            vals.pieces[v] = [next(outs) for _ in range(n)]
        else:
            vals.env[v] = next(outs)


def _piece_info(traced: TracedStep, split_k: set, n: int, loss: ClosedJaxpr):
    """The GradInfo of the marker over the per-piece inputs (its function: the piece loss)."""
    info = traced.info
    diff_mask, grads = [], []
    for k, d in enumerate(info.diff_mask):
        diff_mask += [d] * (n if k in split_k else 1)
    at = 0
    piece_in = loss.jaxpr.invars
    for k, d in enumerate(info.diff_mask):
        width = n if k in split_k else 1
        if d:
            grads += [jax.core.ShapedArray(v.aval.shape, v.aval.dtype) for v in piece_in[at:at + width]]
        at += width
    assert at == len(piece_in), (at, len(piece_in))
    n_value = 1 + num_aux(info)
    hoisted = sum(n if k in split_k else 1 for k in range(len(info.diff_mask) - info.num_hoisted, len(info.diff_mask)))
    fun = jaxpr_as_fun(loss)

    def piece_fun(*flat):
        out = fun(*flat)
        return (out[0], tuple(out[1:])) if info.has_aux else out[0]

    out_avals = tuple(info.out_avals[:n_value]) + tuple(grads)
    flat = lambda m: jax.tree.structure(tuple(range(m)))  # noqa: E731
    return dataclasses.replace(info, fun=piece_fun, in_tree=flat(len(piece_in)), diff_mask=tuple(diff_mask),
                               out_avals=out_avals, out_tree=flat(len(out_avals)), num_hoisted=hoisted)
