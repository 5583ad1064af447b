"""Sharding constraints inserted into a second (sharded) lowering, compiled and run on 8 CPUs."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from alpa_pass.emit.calls import specialize_callees
from alpa_pass.emit.constraints import (SKIP_CALL_PATHS, SKIP_GENERATOR, SKIP_PARAM_OUTPUT,
                                        insert_constraints, sharding_text)
from alpa_pass.errors import EmitError, ShardingError
from alpa_pass.extract.graph import OpKind
from alpa_pass.extract.stablehlo import extract_graph


@pytest.fixture(scope="module")
def mesh():
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))


def _lower_both(f, args, mesh):
    """(graph of the plain lowering, the replicated-sharded Lowered whose module we edit).

    jax caches lowerings per function and hands out the same ir.Module; a fresh wrapper keeps
    the in-place edits of one test out of the next.
    """
    graph = extract_graph(jax.jit(f).lower(*args).compiler_ir("stablehlo"))
    rep = NamedSharding(mesh, P())
    fresh = lambda *a: f(*a)  # noqa: E731
    lowered = jax.jit(fresh, in_shardings=tuple(rep for _ in args), out_shardings=rep).lower(*args)
    return graph, lowered


def _nodes(g, op_name):
    return [v for v in range(g.num_nodes) if g.op_names[v] == op_name]


def _dot_shapes(hlo_text):
    return re.findall(r"= f32\[([\d,]*)\]\{[\d,]*\} dot\(", hlo_text)


def _mlp(w1, w2, x):
    return jnp.tanh(x @ w1) @ w2


def _mlp_args():
    rng = np.random.default_rng(0)
    shapes = ((16, 32), (32, 8), (4, 16))
    return tuple(jnp.asarray(rng.standard_normal(s), jnp.float32) for s in shapes)


def test_sharding_text():
    assert sharding_text([("x",), ()], "mesh") == '#sdy.sharding<@mesh, [{"x"}, {}]>'
    assert sharding_text([("x", "y")], "m") == '#sdy.sharding<@m, [{"x", "y"}]>'
    assert sharding_text([], "mesh") == "#sdy.sharding<@mesh, []>"


@pytest.mark.parametrize("spec, per_device", [
    ([("x",), ("y",)], "2,8"),
    ([(), ("x", "y")], "4,4"),
])
def test_dot_constraint_shapes_the_partitioned_dot(mesh, spec, per_device):
    args = _mlp_args()
    graph, lowered = _lower_both(_mlp, args, mesh)
    dot0 = _nodes(graph, "stablehlo.dot_general")[0]
    assert graph.shape(dot0) == (4, 32)
    report = insert_constraints(lowered._lowering._hlo, graph, {dot0: spec})
    assert report.inserted == 1 and report.skipped == {}
    assert "sdy.sharding_constraint" in lowered.as_text()
    compiled = lowered.compile()
    assert per_device in _dot_shapes(compiled.as_text())
    np.testing.assert_allclose(compiled(*args), jax.jit(_mlp)(*args), rtol=1e-5, atol=1e-5)


def test_skips_generators_params_and_outputs(mesh):
    args = _mlp_args()
    graph, lowered = _lower_both(_mlp, args, mesh)
    tanh = _nodes(graph, "stablehlo.tanh")[0]
    specs = {graph.param_nodes()[0]: [(), ()], graph.output_nodes()[0]: [(), ()],
             tanh: [("x",), ()]}
    gens = [v for v in range(graph.num_nodes) if graph.kind[v] == OpKind.GENERATOR]
    specs.update({v: [()] * len(graph.shape(v)) for v in gens})
    report = insert_constraints(lowered._lowering._hlo, graph, specs)
    assert report.inserted == 1
    assert report.skipped == {SKIP_PARAM_OUTPUT: 2, **({SKIP_GENERATOR: len(gens)} if gens else {})}
    np.testing.assert_allclose(lowered.compile()(*args), jax.jit(_mlp)(*args), rtol=1e-5, atol=1e-5)


@jax.jit
def _helper(a):
    return jnp.sin(a) * 2.0


def _twice(w, x):
    return _helper(_helper(x @ w))


def test_callee_reached_twice(mesh):
    args = (jnp.arange(128.0).reshape(8, 16) / 100, jnp.ones((4, 8)))
    graph, lowered = _lower_both(_twice, args, mesh)
    s0, s1 = _nodes(graph, "stablehlo.sine")
    module = lowered._lowering._hlo
    report = insert_constraints(module, graph, {s0: [("x",), ("y",)], s1: [("x",), ("y",)]})
    assert report.inserted == 1 and report.skipped == {}
    text = lowered.as_text()
    assert text.count("sdy.sharding_constraint") == 1
    callee = text[text.index("func.func private"):]
    assert '<@mesh, [{"x"}, {"y"}]>' in callee
    np.testing.assert_allclose(lowered.compile()(*args), jax.jit(_twice)(*args), rtol=1e-5)


def test_callee_conflicting_call_paths_are_skipped(mesh):
    args = (jnp.ones((8, 16)), jnp.ones((4, 8)))
    graph, lowered = _lower_both(_twice, args, mesh)
    s0, s1 = _nodes(graph, "stablehlo.sine")
    dot = _nodes(graph, "stablehlo.dot_general")[0]
    specs = {s0: [("x",), ()], s1: [(), ("y",)], dot: [("x",), ("y",)]}
    report = insert_constraints(lowered._lowering._hlo, graph, specs)
    assert report.inserted == 1 and report.skipped == {SKIP_CALL_PATHS: 2}
    assert report.num_skipped == 2
    assert lowered.as_text().count("sdy.sharding_constraint") == 1


def test_specialized_callees_take_each_call_paths_constraint(mesh):
    # The conflicting case above after emit.calls: each call reaches its own copy of the callee,
    # so both sines are constrained, each to its own layout, and the numbers do not change.
    args = (jnp.arange(128.0).reshape(8, 16) / 100, jnp.ones((4, 8)))
    graph, lowered = _lower_both(_twice, args, mesh)
    s0, s1 = _nodes(graph, "stablehlo.sine")
    module = lowered._lowering._hlo
    graph = specialize_callees(module, graph)
    assert graph.locators[s0].func != graph.locators[s1].func
    report = insert_constraints(module, graph, {s0: [("x",), ()], s1: [(), ("y",)]})
    assert report.inserted == 2 and report.skipped == {}
    text = lowered.as_text()
    assert text.count("func.func private") == 2 and text.count("sdy.sharding_constraint") == 2
    assert '<@mesh, [{"x"}, {}]>' in text and '<@mesh, [{}, {"y"}]>' in text
    np.testing.assert_allclose(lowered.compile()(*args), jax.jit(_twice)(*args), rtol=1e-5)
    assert specialize_callees(module, graph) is graph  # nothing left to split


def test_module_changed_between_extraction_and_emission(mesh):
    args = _mlp_args()
    graph, _ = _lower_both(_mlp, args, mesh)
    _, other = _lower_both(lambda a, b, x: jnp.sin(x @ a) @ b, args, mesh)
    tanh = _nodes(graph, "stablehlo.tanh")[0]
    with pytest.raises(EmitError, match="module changed between extraction and emission"):
        insert_constraints(other._lowering._hlo, graph, {tanh: [(), ()]})


def test_bad_specs_and_missing_mesh(mesh):
    args = _mlp_args()
    graph, lowered = _lower_both(_mlp, args, mesh)
    dot = _nodes(graph, "stablehlo.dot_general")[0]
    module = lowered._lowering._hlo
    with pytest.raises(ShardingError, match="names 1 dims"):
        insert_constraints(module, graph, {dot: [("x",)]})
    with pytest.raises(ShardingError, match="mesh axis 'z' is not in the mesh"):
        insert_constraints(module, graph, {dot: [("z",), ()]})
    with pytest.raises(ShardingError, match="uses a mesh axis twice"):
        insert_constraints(module, graph, {dot: [("x",), ("x",)]})
    with pytest.raises(EmitError, match="no 'sdy.mesh @other'"):
        insert_constraints(module, graph, {dot: [("x",), ()]}, mesh_name="other")
    assert "sdy.sharding_constraint" not in lowered.as_text()


def test_same_ops_different_shapes_is_a_changed_module(mesh):
    args = _mlp_args()
    graph, _ = _lower_both(_mlp, args, mesh)
    _, other = _lower_both(_mlp, (args[0], args[1], jnp.ones((8, 16))), mesh)
    dot = _nodes(graph, "stablehlo.dot_general")[0]
    with pytest.raises(EmitError, match=r"has shape \(4, 32\) but @main op 0 result 0 has shape "
                                        r"\(8, 32\)"):
        insert_constraints(other._lowering._hlo, graph, {dot: [("x",), ()]})


def _two_reads(w, a, b):
    return jnp.tanh(a @ w), jnp.sin(b @ w)


@pytest.mark.parametrize("last, inserted", [((("y",), ()), 2), ((("x",), ()), 3)])
def test_uses_of_one_value_share_the_steps_they_have_in_common(mesh, last, inserted):
    # Both dots read w through [S(y), R] first (a step, then each use's own layout): one
    # constraint per layout reached, shared where the two chains agree, as XLA's partitioner
    # shares one reshard of a value between its uses (a private copy per use reshards twice).
    rng = np.random.default_rng(0)
    args = tuple(jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((16, 8), (4, 16), (4, 16)))
    graph, lowered = _lower_both(_two_reads, args, mesh)
    d0, d1 = _nodes(graph, "stablehlo.dot_general")
    t0, t1 = (graph.operands(d).index(graph.param_nodes()[0]) for d in (d0, d1))
    step = [("y",), ()]
    report = insert_constraints(lowered._lowering._hlo, graph, {},
                                operand_dim_shardings={(d0, t0): [("y",), ()], (d1, t1): list(last)},
                                operand_steps={(d0, t0): [step], (d1, t1): [step]})
    assert report.inserted == inserted
    assert lowered.as_text().count("sdy.sharding_constraint") == inserted
    for got, want in zip(lowered.compile()(*args), jax.jit(_two_reads)(*args)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _loop(w, x):
    h = x @ w
    return jax.lax.fori_loop(0, 3, lambda i, c: jnp.tanh(c) * 0.5 + c, h)


def test_a_carry_reads_its_init_through_the_whiles_operand(mesh):
    """A use-site layout on a while's carry node (it reads the loop's init) pins the
    ``stablehlo.while`` operand of that slot: the loop carries that layout (without it XLA takes
    the init's and reshards inside the body every iteration). The constraint is named after the
    carry node and its graph operand 0."""
    from alpa_pass.emit.constraints import carry_whiles

    rng = np.random.default_rng(0)
    args = tuple(jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((16, 32), (8, 16)))
    graph, lowered = _lower_both(_loop, args, mesh)
    whiles = carry_whiles(graph)
    results = [v for v in _nodes(graph, "stablehlo.while") if graph.locators[v].op_index >= 0]
    carries = [v for v in range(graph.num_nodes) if graph.locators[v].op_index == -3]
    assert sorted(whiles) == carries and set(whiles.values()) == {graph.locators[results[0]].op_index}
    carry = next(c for c in carries if graph.shape(c) == (8, 32))
    dot = _nodes(graph, "stablehlo.dot_general")[0]
    report = insert_constraints(lowered._lowering._hlo, graph, {dot: [(), ("y",)]},
                                operand_dim_shardings={(carry, 0): [("x",), ()]},
                                operand_steps={(carry, 0): [[(), ()]]})
    assert report.inserted == 3 and report.skipped == {}
    text = lowered.as_text(debug_info=True)
    assert f'loc("alpa_pass/use/%{carry}/0")' in text
    # the dot's layout, the step, then the carried layout, which the while takes as its operand
    pinned = re.search(r'(%\d+) = sdy.sharding_constraint %\d+ <@mesh, \[\{"x"\}, \{\}\]>', text).group(1)
    assert re.search(rf"stablehlo.while\(%\w+ = %\w+, %\w+ = {pinned}\)", text), text
    np.testing.assert_allclose(lowered.compile()(*args), jax.jit(_loop)(*args), rtol=1e-5, atol=1e-5)


def test_a_while_reads_its_carried_values_in_the_carried_layout(mesh):
    """A planned carry node's layout constrains the block argument of its slot in every region
    that reads it (the init, yield and result are constrained as values): left to Shardy, a
    batched while's index could be carried split where the plan and the body's reads keep it
    whole, and XLA gathered it every iteration. The loop's counter is read by the cond only."""
    rng = np.random.default_rng(0)
    args = tuple(jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((16, 32), (8, 16)))
    graph, lowered = _lower_both(_loop, args, mesh)
    carries = {graph.shape(v): v for v in range(graph.num_nodes) if graph.locators[v].op_index == -3}
    report = insert_constraints(lowered._lowering._hlo, graph, {carries[(8, 32)]: [("x",), ()],
                                                                carries[()]: []})
    # the (8, 32) slot in the body, the counter in the cond and the body (it counts there too)
    assert report.inserted == 3 and report.skipped == {}
    text = lowered.as_text()
    whiles = re.findall(r"stablehlo.while\((.*?)\) : ", text)
    assert len(whiles) == 1
    slots = re.findall(r"(%iterArg\w*) = ", whiles[0])
    counter, value = slots[0], slots[1]
    arg_reads = [line.strip() for line in text.splitlines() if re.search(rf"{value}\b", line)][1:]
    assert len(arg_reads) == 1 and re.match(
        rf'%\w+ = sdy.sharding_constraint {value} <@mesh, \[\{{"x"\}}, \{{\}}\]>', arg_reads[0]), arg_reads
    counter_reads = [line.strip() for line in text.splitlines() if re.search(rf"{counter}\b", line)][1:]
    assert len(counter_reads) == 2 and all(r.startswith("%") and f"sharding_constraint {counter} <@mesh, []>" in r
                                           for r in counter_reads), counter_reads
    np.testing.assert_allclose(lowered.compile()(*args), jax.jit(_loop)(*args), rtol=1e-5, atol=1e-5)


def test_only_pure_callbacks_on_a_branch_run_on_every_device():
    """``emit.callbacks``: a pure callback inside a ``cond`` branch (an error check) gets a
    replicated sharding on the plan's mesh; the same callback outside a branch, and a
    ``jax.debug.callback`` (a side effect) inside one, keep jax's device 0."""
    from alpa_pass.emit.callbacks import replicate_branch_callbacks

    def check(v):
        return jax.pure_callback(lambda a: a, jax.ShapeDtypeStruct(v.shape, v.dtype), v)

    def f(x):
        y = jax.lax.cond(jnp.isnan(x).any(), check, lambda v: v, x)
        jax.lax.cond(x.sum() > 0, lambda v: jax.debug.callback(print, v), lambda v: None, x)
        return check(y).sum()

    module = jax.jit(f).lower(jnp.ones((4, 8))).compiler_ir("stablehlo")
    assert replicate_branch_callbacks(module, "mesh") == 1
    shardings = [m for line in str(module).splitlines() if "python_cpu_callback" in line
                 for m in re.findall(r"sdy.sharding = (#sdy.sharding_per_value<\[<@\w+, \[[^\]]*\]>\]>)", line)]
    replicated = "#sdy.sharding_per_value<[<@mesh, [{}, {}]>]>"
    assert len(shardings) == 3 and shardings.count(replicated) == 1, shardings
    assert all(re.fullmatch(r"#sdy.sharding_per_value<\[<@(maximal_mesh|single_device)_0, \[\]>\]>", s)
               for s in shardings if s != replicated), shardings  # (jax's one device, as jax named it)
