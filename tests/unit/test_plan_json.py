"""Plan JSON round trip and validation, cache entries, mesh-shape search logic, progress display."""
from __future__ import annotations

import copy
import io
import json
import logging
import re
import time

import jax
import pytest
from jax.sharding import PartitionSpec as P

import alpa_pass as ap
from alpa_pass.driver import auto_mesh, cache, planning, request
from alpa_pass.driver.jit import make_plan
from alpa_pass.driver.request import PlanRequest
from alpa_pass.plan import serialize
from alpa_pass.plan.plan import search_summary
from alpa_pass.driver.progress import PlanningProgress, planning_progress
from zoo import default_optimizer, init_state, mlp


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def _mlp_args(config=mlp.Config(num_layers=2, hidden=32, batch=16)):
    state = init_state(mlp.init(jax.random.key(0), config), default_optimizer())
    return _abstract((state, mlp.make_batch(jax.random.key(1), config)))


@pytest.fixture(scope="module")
def planned():
    """(plan, graph) of the MLP step on a 2x4 mesh."""
    plan, graph, _ = make_plan(mlp.make_train_step(default_optimizer()), _mlp_args(),
                               ap.LogicalMesh(shape=(2, 4), beta=(1.0, 0.5)), ap.AutoShardingOption())
    return plan, graph


@pytest.fixture(scope="module")
def plan(planned):
    return planned[0]


def test_json_round_trip_keeps_everything_emission_and_summary_need(plan):
    text = plan.to_json()
    d = json.loads(text)
    assert len(text.splitlines()) == len(d) + 2  # braces + one top-level key per line
    assert d["format"] == "alpa_pass.plan" and d["format_version"] == serialize.FORMAT_VERSION
    assert d["mesh"] == {"shape": [2, 4], "axis_names": ["x", "y"], "alpha": [1.0, 1.0], "beta": [1.0, 0.5]}
    assert d["made_with"]["jax"] == jax.__version__ and d["made_with"]["alpa_pass"] == ap.__version__
    assert d["made_with"]["options"]["solver_rel_gap"] == 1e-4 and "emit" not in d["made_with"]["options"]
    assert len(d["fingerprint"]) == 64 and d["origin"] == "solver"

    back = ap.Plan.from_json(text)
    assert back.mesh == plan.mesh
    for name in ("objective", "predicted", "node_specs", "operand_specs", "input_specs", "output_specs",
                 "ilp_size", "solve_time_s", "solver_status", "mip_gap", "timings", "fallbacks",
                 "fingerprint", "made_with", "origin", "mesh_search"):
        assert getattr(back, name) == getattr(plan, name), name
    assert [vars(c) for c in back.choices] == [vars(c) for c in plan.choices]
    assert back.summary() == plan.summary()
    assert back.to_json() == text


def test_multi_axis_spec_entries_round_trip(plan):
    d = serialize.plan_to_dict(plan)
    d["input_specs"][0] = [["x", "y"], None]
    back = ap.Plan.from_dict(json.loads(json.dumps(d)))
    assert back.input_specs[0] == P(("x", "y"), None)


def test_save_and_load_a_file(plan, tmp_path):
    path = tmp_path / "sub" / "plan.json"
    path.parent.mkdir()
    plan.save(path)
    assert [p.name for p in path.parent.iterdir()] == ["plan.json"]  # no temporary file left
    assert ap.Plan.load(path).node_specs == plan.node_specs


@pytest.mark.parametrize("edit, match", [
    (lambda d: "{not json", "invalid JSON"),
    (lambda d: json.dumps({**d, "format": "other"}), "not an alpa_pass plan"),
    (lambda d: json.dumps({**d, "format_version": 99}), "format version 99"),
    # version 1 listed the axes of a multi-axis dim in mesh order, emission in another: refused
    (lambda d: json.dumps({**d, "format_version": 1}), "format version 1 .* re-plan"),
    (lambda d: json.dumps({**d, "axis_order": ["x", "x"]}), "corrupt.*axis_order"),
    (lambda d: json.dumps({k: v for k, v in d.items() if k != "node_specs"}), "incomplete or corrupt.*node_specs"),
    (lambda d: json.dumps({**d, "operand_specs": d["operand_specs"][:-1]}), "corrupt"),
    (lambda d: json.dumps({**d, "mesh": {**d["mesh"], "alpha": [1.0]}}), "corrupt"),
])
def test_from_json_rejects_what_it_cannot_read(plan, edit, match):
    with pytest.raises(ap.PlanMismatchError, match=match):
        ap.Plan.from_json(edit(serialize.plan_to_dict(plan)))


def test_check_applicable_says_what_differs(plan):
    ok = dict(fingerprint=plan.fingerprint, mesh=plan.mesh, num_nodes=len(plan.node_specs))
    serialize.check_applicable(plan, **ok)
    assert issubclass(ap.PlanMismatchError, ap.ShardingError)
    with pytest.raises(ap.PlanMismatchError, match="another function signature"):
        serialize.check_applicable(plan, **{**ok, "fingerprint": "0" * 64})
    with pytest.raises(ap.PlanMismatchError, match=r"shape \[2, 4\] \(plan\) vs \[4, 2\] \(mesh\)"):
        serialize.check_applicable(plan, **{**ok, "mesh": ap.LogicalMesh(shape=(4, 2), beta=(1.0, 0.5))})
    with pytest.raises(ap.PlanMismatchError, match=r"beta \[1.0, 0.5\] \(plan\) vs \[1.0, 1.0\]"):
        serialize.check_applicable(plan, **{**ok, "mesh": ap.LogicalMesh(shape=(2, 4))})
    old = ap.Plan.from_dict({**serialize.plan_to_dict(plan),
                                    "made_with": {**plan.made_with, "jax": "0.4.1"}})
    with pytest.raises(ap.PlanMismatchError, match=f"jax 0.4.1 but this is jax {jax.__version__}"):
        serialize.check_applicable(old, **ok)


def test_fingerprint_depends_on_text_avals_node_count_and_donation():
    a = [jax.ShapeDtypeStruct((4, 8), "float32")]
    base = request.fingerprint("module", a, 10)
    assert base == request.fingerprint("module", [jax.ShapeDtypeStruct((4, 8), "float32")], 10)
    assert len({base, request.fingerprint("module2", a, 10), request.fingerprint("module", a, 11),
                request.fingerprint("module", [jax.ShapeDtypeStruct((4, 8), "bfloat16")], 10),
                request.fingerprint("module", a, 10, donated=[0])}) == 5


def test_cache_round_trip_and_bad_entries(planned, tmp_path, caplog):
    plan, n = planned
    option = ap.AutoShardingOption(plan_cache_dir=tmp_path)
    assert option.plan_cache_dir == str(tmp_path)
    assert cache.load_cached(tmp_path, plan.fingerprint, plan.mesh, option, n) is None  # no entry: quiet
    path = cache.store_cached(tmp_path, plan, option)
    hit = cache.load_cached(tmp_path, plan.fingerprint, plan.mesh, option, n)
    assert hit.origin == "cache" and hit.node_specs == plan.node_specs and not caplog.records
    # other planning options or another mesh: another entry
    for other in (ap.AutoShardingOption(solver_rel_gap=0.1), ap.AutoShardingOption(memory_budget_per_device=2**30)):
        assert cache.entry_path(tmp_path, plan.fingerprint, plan.mesh, other) != path
    assert cache.entry_path(tmp_path, plan.fingerprint, ap.LogicalMesh(shape=(2, 4)), option) != path
    # ... but not options that only change emission or display
    assert cache.entry_path(tmp_path, plan.fingerprint, plan.mesh,
                            ap.AutoShardingOption(emit="anchors", show_progress=False)) == path
    for bad in ("{half a fi", plan.to_json().replace(plan.fingerprint, "f" * 64)):
        with open(path, "w") as f:
            f.write(bad)
        with caplog.at_level(logging.WARNING, logger="alpa_pass"):
            assert cache.load_cached(tmp_path, plan.fingerprint, plan.mesh, option, n) is None
        assert "ignoring plan cache entry" in caplog.records[-1].getMessage()



def test_a_solve_cut_off_by_the_bound_is_not_cached(planned, tmp_path, monkeypatch):
    """With solver_objective_bound, HiGHS may stop at its first incumbent once it proves the bound
    unbeatable: such a plan is no optimum and must not be served to a later unbounded request."""
    plan, graph = planned
    solved = copy.copy(plan)
    monkeypatch.setattr(planning, "solve_graph", lambda *a, **k: solved)
    for bound, stored in ((solved.objective, False), (solved.objective * 2, True), (None, True)):
        option = ap.AutoShardingOption(plan_cache_dir=tmp_path / str(bound), solver_objective_bound=bound)
        planning._plan_one(PlanRequest(graph, plan.mesh, option, fingerprint=plan.fingerprint), plan.mesh,
                           option, None)
        hit = cache.load_cached(option.plan_cache_dir, plan.fingerprint, plan.mesh, option, graph)
        assert (hit is not None) == stored, bound

def test_logical_shapes():
    assert auto_mesh.logical_shapes(8) == [(1, 8), (2, 4), (4, 2), (8, 1), (2, 2, 2)]
    assert auto_mesh.logical_shapes(12)[:6] == [(1, 12), (2, 6), (3, 4), (4, 3), (6, 2), (12, 1)]
    assert sorted(auto_mesh.logical_shapes(12)[6:]) == [(2, 2, 3), (2, 3, 2), (3, 2, 2)]
    assert auto_mesh.logical_shapes(7) == [(1, 7), (7, 1)]
    assert auto_mesh.logical_shapes(1) == [(1, 1)]


class _FakePlan:
    def __init__(self, mesh, objective):
        self.mesh, self.objective, self.origin, self.mip_gap = mesh, objective, "solver", 0.0
        self.timings, self.mesh_search = {"solve": 0.5}, []


def test_search_keeps_the_cheapest_and_skips_symmetric_repeats():
    objectives = {(1, 8): 8.0, (2, 4): 6.0, (4, 2): 7.0, (2, 2, 2): 6.0}
    calls = []

    def plan_one(mesh, bound):
        calls.append((mesh.shape, bound))
        return _FakePlan(mesh, objectives[mesh.shape])

    best = auto_mesh.search_meshes(auto_mesh.candidate_meshes(8), plan_one)
    # 8x1 poses the same ILP as 1x8 (one axis of 8); 4x2 is 2x4 with the larger axis major, which
    # a dim split over both tiles the other way round (other collective-permutes): solved. Each
    # solve is bounded by the best so far.
    assert calls == [((1, 8), None), ((2, 4), 8.0), ((4, 2), 6.0), ((2, 2, 2), 6.0)]
    assert best.mesh.shape == (2, 4)  # 2x2x2 ties with it: the earlier shape is kept
    assert [(tuple(e["shape"]), e["objective"], e.get("same_as")) for e in best.mesh_search] == [
        ((1, 8), 8.0, None), ((2, 4), 6.0, None), ((4, 2), 7.0, None), ((8, 1), 8.0, [1, 8]),
        ((2, 2, 2), 6.0, None)]
    assert search_summary(best.mesh_search, (2, 4)) == \
        "mesh search: 1x8 8, 2x4 6 (chosen), 4x2 7 (cut off), 8x1 = 1x8, 2x2x2 6 (cut off)"
    assert [e.get("cut_off") for e in best.mesh_search] == [False, False, True, None, True]


def test_search_solves_permutations_with_other_costs_and_survives_infeasible_shapes():
    meshes = [ap.LogicalMesh(shape=(2, 4), beta=(1.0, 0.1)), ap.LogicalMesh(shape=(4, 2), beta=(1.0, 0.1)),
              ap.LogicalMesh(shape=(8, 1))]

    def plan_one(mesh, bound):
        if mesh.shape == (2, 4):
            raise ap.InfeasibleError("too small")
        return _FakePlan(mesh, 3.0)

    best = auto_mesh.search_meshes(meshes, plan_one)
    assert best.mesh.shape == (4, 2)
    assert [e["objective"] for e in best.mesh_search] == [None, 3.0, 3.0]
    assert best.mesh_search[0]["error"] == "too small" and "same_as" not in best.mesh_search[2]
    assert "2x4 infeasible" in search_summary(best.mesh_search)
    with pytest.raises(ap.InfeasibleError, match="too small"):
        auto_mesh.search_meshes(meshes[:1], plan_one)


def test_progress_prints_stages_only_when_enabled():
    out = io.StringIO()
    with PlanningProgress(True, 0.0, out) as p:
        p._show()  # what the timer does after delay_s (called here to be deterministic)
        p.stage("solve ILP (12 columns)")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].startswith("alpa_pass planning: solve ILP (12 columns) (")
    quiet = io.StringIO()
    with planning_progress(None, quiet) as p:  # auto: a StringIO is not a terminal
        assert not p.enabled
        p.stage("extract")
    with planning_progress(False, quiet) as p:
        p.stage("extract")
    assert quiet.getvalue() == ""


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_on_a_terminal_is_a_ticking_status_line_that_clears():
    term = _Terminal()
    pattern = r"alpa_pass planning: solve ILP \(5 columns\) \((\d\.\d) s\)"
    with planning_progress(True, term) as p:
        p.stage("solve ILP (5 columns)")
        deadline = time.monotonic() + 30  # a loaded machine may schedule the refresh thread late
        while len(set(re.findall(pattern, term.getvalue()))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    out = term.getvalue()
    ticks = set(re.findall(pattern, out))
    assert len(ticks) >= 2  # re-rendered with the elapsed time while it waits
    assert "\r" in out and out.endswith("\x1b[2K")  # redrawn in place, erased at the end
    assert planning_progress(None, _Terminal()).enabled


def test_shard_parallel_plan_and_auto_options(plan, tmp_path):
    path = tmp_path / "plan.json"
    plan.save(path)
    method = ap.ShardParallel(plan=str(path))
    assert isinstance(method.plan, ap.Plan) and method.resolved_mesh() == plan.mesh
    assert ap.ShardParallel().resolved_mesh().shape == (1, 8)  # the default stays 1 x N
    assert [m.shape for m in ap.ShardParallel(mesh="auto").resolved_mesh()] == auto_mesh.logical_shapes(8)
    with pytest.raises(ValueError, match="fixes its mesh"):
        ap.ShardParallel(mesh="auto", plan=plan)
    with pytest.raises(TypeError, match="a Plan or the path"):
        ap.ShardParallel(plan=42)
    with pytest.raises(TypeError, match='"auto" or None'):
        ap.ShardParallel(mesh="best")
    with pytest.raises(ValueError, match="show_progress"):
        ap.AutoShardingOption(show_progress="yes")


def test_leaf_specs_list_multi_axis_dims_in_the_plan_axis_order(planned):
    """One axis order per plan: the entry/output specs and every node's spec list the axes of a
    dim split over both mesh axes in ``plan.axis_order`` (what emission writes), also after a
    JSON round trip."""
    plan, graph = planned
    assert sorted(plan.axis_order) == ["x", "y"]
    multi = [s for s in plan.input_specs + plan.output_specs for e in s if isinstance(e, tuple) and len(e) > 1]
    for spec in multi:
        for e in spec:
            if isinstance(e, tuple) and len(e) > 1:
                assert list(e) == [a for a in plan.axis_order if a in e]
    for v in graph.param_nodes():
        assert plan.choices[v].spec == plan.mesh.spec_to_partition_spec(plan.node_specs[v], len(graph.shape(v)),
                                                                        plan.axis_order)
    back = ap.Plan.from_json(plan.to_json())
    assert back.axis_order == plan.axis_order and back.input_specs == plan.input_specs
    assert [c.spec for c in back.choices] == [c.spec for c in plan.choices]
    reordered = ap.LogicalMesh(shape=(2, 4)).spec_to_partition_spec([0, 0], 1, ("y", "x"))
    assert reordered == P(("y", "x"))
