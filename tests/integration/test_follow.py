"""``FollowParallel``: an eval step planned to use a train step's parameters where they lie.

Its parameter leaves take the train step's layouts (found by structure or key path) and every op
reads them as they are: the compiled eval step has no collective on a parameter (except where the
core has no strategy for the layout: a gather from a vocabulary-split embedding table), and its
numbers equal plain ``jax.jit``.
"""
from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import alpa_pass as ap
from alpa_pass.errors import ShardingError
from alpa_pass.methods.layouts import match_leaves
from tests.helpers import collectives
from zoo import default_optimizer, gpt, init_state, mlp

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?(%[\w.\-]+)\s*=\s*.*?\s([a-z][\w\-]*)\((.*)$")
_PASS_THROUGH = {"bitcast", "copy", "reshape", "transpose", "convert"}


def parameter_reads(hlo_text: str, param_numbers) -> list[str]:
    """The collectives of compiled ``hlo_text`` whose operand is (a bitcast/copy/reshape/transpose
    /convert of) an ENTRY parameter whose number is in ``param_numbers``."""
    entry = hlo_text[hlo_text.index("\nENTRY"):]
    defs = {}
    for line in entry.splitlines():
        m = _INSTR.match(line)
        if m:
            defs[m.group(1)] = (m.group(2), m.group(3))

    def param_of(name, depth=0):
        opcode, rest = defs.get(name, ("", ""))
        if opcode == "parameter":
            return int(rest.split(")")[0])
        if opcode in _PASS_THROUGH and depth < 8:
            return param_of(re.match(r"\s*(%[\w.\-]+)", rest).group(1), depth + 1)
        return None

    hits = []
    for c in collectives(entry):
        operands = re.findall(r"%[\w.\-]+", c.line.split("(", 1)[1].split(")")[0])
        if any(param_of(o) in param_numbers for o in operands):
            hits.append(c.line.strip()[:160])
    return hits


def _train(model, config, optimizer, mesh_shape=(2, 4), method=ap.ShardParallel):
    p_train = ap.parallelize(model.make_train_step(optimizer) if model is mlp else model.make_train_step(optimizer, config),
                             method=method(mesh=ap.LogicalMesh(shape=mesh_shape)))
    state = init_state(model.init(jax.random.key(0), config), optimizer)
    state, _ = p_train(state, model.make_batch(jax.random.key(1), config))
    return p_train, state


def _follow_mlp(method, mesh_shape):
    config = mlp.Config(num_layers=3, hidden=64, batch=16)
    p_train, state = _train(mlp, config, default_optimizer(), mesh_shape, method)
    eval_batch = mlp.make_batch(jax.random.key(2), mlp.Config(num_layers=3, hidden=64, batch=32))
    p_eval = ap.parallelize(mlp.loss_fn, method=ap.FollowParallel(p_train))
    exe = p_eval.get_executable(state[0], eval_batch)
    n = len(jax.tree.leaves(state[0]))
    assert exe.input_shardings[:n] == p_train.executables[0].output_shardings[:n]
    assert any(s.spec != P() for s in exe.input_shardings[:n]), "nothing split: weak test"
    want = jax.jit(mlp.loss_fn)(jax.device_get(state[0]), eval_batch)
    np.testing.assert_allclose(float(p_eval(state[0], eval_batch)), float(want), rtol=1e-5)
    return p_train, exe, n


@pytest.mark.parametrize("method", [ap.ShardParallel, ap.Zero3Parallel])
def test_eval_step_reads_the_parameters_where_the_train_step_left_them(method):
    _, exe, n = _follow_mlp(method, (1, 8))
    assert parameter_reads(exe.hlo_text(), set(range(n))) == []


def test_on_2x4_no_parameter_changes_layout():
    """On 2x4 the parameters split over both axes are only permuted (axis order, see below),
    never gathered or redistributed; the train step permutes the same ones."""
    p_train, exe, n = _follow_mlp(ap.ShardParallel, (2, 4))
    reads = parameter_reads(exe.hlo_text(), set(range(n)))
    assert all("collective-permute(" in r for r in reads), reads
    train_reads = parameter_reads(p_train.executables[0].hlo_text(), set(range(n)))
    assert len(reads) <= len(train_reads)


def test_on_2x4_no_collective_reads_a_parameter():
    _, exe, n = _follow_mlp(ap.ShardParallel, (2, 4))
    assert parameter_reads(exe.hlo_text(), set(range(n))) == []


def test_gpt_eval_step_follows_the_train_step():
    """eval_step(params, batch) with another batch size: parameters keep their layouts and no
    collective reads one, except the embedding gather's table when the train plan split it on the
    vocabulary (no gather strategy reads it so; the planner logs it)."""
    config = gpt.Config(layers=2)
    p_train, state = _train(gpt, config, default_optimizer(), (1, 8))
    loss_fn = gpt.make_loss_fn(config.heads)
    eval_batch = gpt.make_batch(jax.random.key(2), gpt.Config(layers=2, batch=16))
    p_eval = ap.parallelize(loss_fn, method=ap.FollowParallel(p_train))
    exe = p_eval.get_executable(state[0], eval_batch)
    leaves = jax.tree.leaves(state[0])
    assert exe.input_shardings[:len(leaves)] == p_train.executables[0].output_shardings[:len(leaves)]
    wte = next(i for i, x in enumerate(leaves) if x is state[0]["wte"])
    allowed = {wte} if exe.input_shardings[wte].spec[:1] not in ((), (None,)) else set()
    reads = parameter_reads(exe.hlo_text(), set(range(len(leaves))) - allowed)
    assert reads == [], reads
    want = jax.jit(loss_fn)(jax.device_get(state[0]), eval_batch)
    np.testing.assert_allclose(float(p_eval(state[0], eval_batch)), float(want), rtol=1e-5)
    # the same step planned freely takes other layouts: following is not a no-op here
    free = ap.parallelize(loss_fn, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=(1, 8))))
    assert free.get_executable(state[0], eval_batch).input_shardings[:len(leaves)] != exe.input_shardings[:len(leaves)]


def test_match_rule_structure_first_then_key_path():
    params = {"w": jax.ShapeDtypeStruct((4, 4), np.float32), "b": jax.ShapeDtypeStruct((4,), np.float32)}
    batch = {"x": jax.ShapeDtypeStruct((8, 4), np.float32)}
    train_args = ((params, (params, params)), batch)  # (params, adam's mu and nu), batch
    # eval_step(params, batch): params are state[0], not the moments; the one-leaf batch is
    # matched by key path only ([1]['x'], the train batch's, when the shape agrees)
    assert match_leaves(train_args, (params, batch)) == {0: 0, 1: 1, 2: 6}
    assert match_leaves(train_args, (params, {"x": jax.ShapeDtypeStruct((16, 4), np.float32)})) == {0: 0, 1: 1}
    assert match_leaves(train_args, train_args) == {i: i for i in range(7)}
    assert match_leaves(train_args, ({"w": params["w"]},)) == {}  # another structure, another path


def test_follow_needs_one_train_signature():
    p_train = ap.parallelize(mlp.make_train_step(default_optimizer()))
    with pytest.raises(ShardingError, match="has planned 0 argument signatures"):
        ap.FollowParallel(p_train).resolved_mesh()
    with pytest.raises(ShardingError, match="got function"):
        ap.FollowParallel(mlp.loss_fn).resolved_mesh()
