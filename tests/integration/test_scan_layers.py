"""A GPT whose blocks are one scanned layer stack (flax ``nn.scan``, ``nn.scan(nn.remat(...))``,
``lax.scan`` over stacked params: ``zoo.gpt_scan``) is planned like its unrolled twin: per layer the
same parameter specs, about the same ILP objective, the same compiled per-device FLOPs within 10%,
and it trains like single-device ``jax.jit`` over 3 Adam steps."""
from __future__ import annotations

import re

import jax
import numpy as np
import pytest

import alpa_pass as ap
from zoo import default_optimizer, gpt_scan, init_state

OPT = default_optimizer()
KINDS = {"lax": dict(flax=False), "flax": dict(flax=True), "flax_remat": dict(flax=True, remat=True)}


def _config(kind: str) -> gpt_scan.Config:
    return gpt_scan.Config(layers=4, hidden=64, heads=4, seq=16, batch=8, vocab=64, **KINDS[kind])


def _setup(config):
    state = init_state(gpt_scan.init(jax.random.key(0), config), OPT)
    batches = [gpt_scan.make_batch(jax.random.key(100 + i), config) for i in range(3)]
    return gpt_scan.make_train_step(OPT, config), state, batches


def _param_specs(plan, params) -> dict:
    """Path tuple -> spec padded to the leaf's rank, for the parameter leaves (first inputs)."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    out = {}
    for (path, leaf), spec in zip(leaves, plan.input_specs):
        keys = tuple(getattr(k, "key", getattr(k, "idx", None)) for k in path)
        out[keys] = tuple(spec) + (None,) * (leaf.ndim - len(spec))
    return out


def _twin_path(config, path: tuple, layer: int) -> tuple:
    return (f"block_{layer}", *path[1:]) if config.flax else ("blocks", layer, *path[1:])


def _plans(config, shape):
    mesh = ap.LogicalMesh(shape=shape)
    plans = {}
    for c in (config, config.twin()):
        step, state, batches = _setup(c)
        plans[c.scan] = (ap.parallelize(step, method=ap.ShardParallel(mesh=mesh)).plan(state, batches[0]), state[0])
    return plans


@pytest.mark.parametrize("kind,shape", [
    ("lax", (1, 8)),
    pytest.param("flax", (1, 8), marks=pytest.mark.slow),
    pytest.param("flax_remat", (1, 8), marks=pytest.mark.slow),
    pytest.param("lax", (2, 4), marks=pytest.mark.slow),
    pytest.param("flax", (2, 4), marks=pytest.mark.slow),
    pytest.param("flax_remat", (2, 4), marks=pytest.mark.slow),
])
def test_scanned_gpt_is_planned_like_its_unrolled_twin(kind, shape):
    """The scan's loop body is planned once and costed x layers. The backward loop's last
    iteration (layer 0's backward) runs peeled (``AutoShardingOption.peel_layer_scans``,
    ``trace/scan_peel.py``), so it hands the activation gradient to the embedding gradient in its
    own layout as the twin's layer 0 does, not in the loop's. On 1x8 (both ILPs refined to
    optimality, unmerged) the objective is within 1% of the twin's: 0.9991 lax, 0.9995 flax,
    0.9996 flax_remat measured (unpeeled: 1.022, 1.022, 1.0004, the loop all-gathering the
    gradient in its last iteration too). The scan may be the cheaper: the twin's unmerged solve
    keeps its repeated-layer ties; untied the twin gets 973576 / 975372 / 1088268 against the
    scan's 973562 / 974909 / 1088262. On 2x4 both plans come from the merged ILP (the unmerged
    ones exceed the refinement's column cap), a heuristic: 1.0002 (lax), 0.9953 (flax), 0.9991
    (flax_remat) measured. It was 0.911 / 0.918 / 1.000 while a residual add followed its first
    operand (the residual stream), which chained every layer's stream into one layout in the twin
    and not in the scan's one body (``pick_leader`` in ``cpp/src/rules/elementwise.cc``). flax_remat was 1.019 while the repeat analysis tied the stacked wo to
    wv (same-shaped params side by side, stride 2; their dots read them differently): now only
    classes anchored to repeated compute are tied (``cpp/include/alpa/repeat.h``). On 1x8
    every layer of the twin gets the stacked param's spec (dim 0, the layer dim, never split)."""
    config = _config(kind)
    plans = _plans(config, shape)
    (scan, scan_params), (twin, twin_params) = plans[True], plans[False]
    assert scan.fallbacks == {} and twin.fallbacks == {}
    refined = (scan.refinement["solve"], twin.refinement["solve"])
    if refined[0] == refined[1]:
        ratio = scan.objective / twin.objective
    else:
        # one ILP refined, the other not: on 2x4 flax_remat (session 48, the column cap lifted) the
        # scan's unmerged ILP (324k columns) refines to 801,132 (-7.7%), the twin's untied one (609k)
        # needs over REFINE_LP_ITERATIONS and keeps its merged 865,813: the merged plans compare
        assert refined == ("unmerged", "merged") and scan.objective < twin.objective, refined
        ratio = scan.refinement["merged_objective"] / twin.refinement["merged_objective"]
    assert abs(ratio - 1) <= 0.01, (scan.objective, twin.objective, scan.refinement, twin.refinement)
    specs, twin_specs = _param_specs(scan, scan_params), _param_specs(twin, twin_params)
    stacked = [p for p in specs if p[0] == "blocks"]
    assert len(stacked) == 13
    for path in stacked:
        assert specs[path][0] is None, (path, specs[path])  # the layer dim stays whole
    if shape == (1, 8):
        assert any(any(d is not None for d in specs[p]) for p in stacked), "every block weight replicated"
        for path in stacked:
            for layer in range(config.layers):
                assert twin_specs[_twin_path(config, path, layer)] == specs[path][1:], (path, layer)


_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.-]+) \((.*)\) -> .* \{$")
_INSTR = re.compile(r"^\s*(?:ROOT )?%([\w.-]+) = (\w+)\[([\d,]*)\]\S* (\w[\w-]*)\(([^)]*)\)(.*)$")
_PARAM = re.compile(r"([\w.-]+): \w+\[([\d,]*)\]")
_CALLEE = re.compile(r"(calls|body|condition|to_apply)=%([\w.-]+)")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def _dims(text: str) -> list[int]:
    return [int(d) for d in text.split(",") if d]


def dot_flops(hlo_text: str) -> float:
    """Per-device dot FLOPs of compiled HLO text, a while body's counted ``known_trip_count``
    times (XLA's ``cost_analysis`` counts a loop body once): 2 * |result| * |contracted dims|."""
    comps, entry, current = {}, None, None
    for line in hlo_text.splitlines():
        m = _COMPUTATION.match(line)
        if m:
            current = comps.setdefault(m.group(1), {"shapes": {}, "dots": [], "calls": []})
            current["shapes"].update((n, _dims(d)) for n, d in _PARAM.findall(m.group(2)))
            entry = m.group(1) if line.startswith("ENTRY") else entry
            continue
        if current is None:
            continue
        trip = _TRIP.search(line)
        for kind, callee in _CALLEE.findall(line):
            current["calls"].append((callee, int(trip.group(1)) if kind == "body" and trip else 1))
        m = _INSTR.match(line)
        if not m:
            continue
        name, _, shape, op, args, attrs = m.groups()
        current["shapes"][name] = _dims(shape)
        if op == "dot":
            lhs = args.split(",")[0].strip().lstrip("%")
            contracting = _dims(re.search(r"lhs_contracting_dims=\{([\d,]*)\}", attrs).group(1))
            current["dots"].append((_dims(shape), lhs, contracting))

    def count(name: str, times: float) -> float:
        comp = comps[name]
        total = sum(2.0 * np.prod(out) * np.prod([comp["shapes"][lhs][d] for d in contracting])
                    for out, lhs, contracting in comp["dots"])
        return times * total + sum(count(callee, times * n) for callee, n in comp["calls"])

    return count(entry, 1.0)


@pytest.mark.slow
@pytest.mark.parametrize("kind,shape", [
    ("flax", (2, 4)),
    ("lax", (1, 8)),
    ("flax_remat", (1, 8)),  # (lax, 2x4), (flax, 1x8), (flax_remat, 2x4) pass too: left out for CI time
])
def test_scanned_gpt_trains_like_jit_with_the_twins_flops(kind, shape):
    """3 Adam steps of the scanned GPT give jax.jit's losses and parameters; the compiled step's
    per-device dot FLOPs (loop bodies x trip count) are within 10% of the unrolled twin's compiled
    step's (and well under the single-device step's: the loop body runs on shards)."""
    config = _config(kind)
    mesh = ap.LogicalMesh(shape=shape)
    flops = {}
    for c in (config, config.twin()):
        step, state, batches = _setup(c)
        f = ap.parallelize(step, method=ap.ShardParallel(mesh=mesh))
        flops[c.scan] = dot_flops(f.get_executable(state, batches[0]).hlo_text())
        if not c.scan:
            continue
        single = dot_flops(jax.jit(step).lower(state, batches[0]).compile().as_text())
        ref = state
        for batch in batches:
            state, loss = f(state, batch)
            ref, ref_loss = jax.jit(step)(ref, batch)
            np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
        for got, want in zip(jax.tree.leaves(state[0]), jax.tree.leaves(ref[0])):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)
    assert abs(flops[True] / flops[False] - 1) <= 0.10, flops
    assert flops[True] < 0.5 * single, (flops[True], single)


def test_dot_flops_counts_a_loop_body_once_per_iteration():
    """The counter the FLOPs test uses: a 4-step scan of [8, 32] @ [32, 32] and its gradient
    (forward, weight and input gradients: 12 dots) against the count by hand; the unrolled loop's
    gradient skips the first layer's input gradient (11 dots)."""
    import jax.numpy as jnp
    from jax import lax

    def scanned(ws, x):
        return lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0].sum()

    def unrolled(ws, x):
        for i in range(4):
            x = jnp.tanh(x @ ws[i])
        return x.sum()

    one = 2 * 8 * 32 * 32
    for fn, dots in ((scanned, 12), (unrolled, 11)):
        text = jax.jit(jax.grad(fn)).lower(jnp.ones((4, 32, 32)), jnp.ones((8, 32))).compile().as_text()
        assert dot_flops(text) == dots * one


def test_layer_stack_inside_an_inner_jit_is_peeled_like_a_top_level_one():
    """A loss under its own ``jax.jit`` inside the step (``value_and_grad(jax.jit(loss))``): the
    scan and its backward loop sit inside jit calls; those calls are inlined and the backward loop
    peeled as at the top level (``trace/scan_peel.py``, ``trace/inline.py``): the same ILP and
    objective as the plain step, and the same losses as single-device ``jax.jit``."""
    from alpa_pass.trace.scan_peel import peel_layer_scans
    from zoo import train_step_for

    config = _config("lax")
    plain, state, batches = _setup(config)
    inner = train_step_for(jax.jit(gpt_scan.make_loss_fn(config)), OPT)
    text = str(jax.make_jaxpr(inner)(state, batches[0]))
    assert "jit" in text and text.index("jit") < text.index("scan"), "the scan must sit inside a jit call"
    mesh = ap.LogicalMesh(shape=(1, 8))
    plans = [ap.parallelize(f, method=ap.ShardParallel(mesh=mesh)).plan(state, batches[0]) for f in (plain, inner)]
    assert plans[1].objective == pytest.approx(plans[0].objective, rel=1e-9)
    assert plans[1].ilp_size["columns"] == plans[0].ilp_size["columns"]
    # peeled: both top-level programs run the backward loop for 3 of its 4 iterations
    def scan_lengths(f):
        peeled = peel_layer_scans(jax.make_jaxpr(f)(state, batches[0]))
        assert peeled is not None
        return [int(e.params["length"]) for e in peeled.jaxpr.eqns if e.primitive.name == "scan" and e.params["reverse"]]
    assert scan_lengths(inner) == scan_lengths(plain) == [3]  # (the forward scan stays in its jit call)
    step = ap.parallelize(inner, method=ap.ShardParallel(mesh=mesh))
    ref = jax.jit(plain)
    s, r = state, jax.device_put(state, jax.devices()[0])
    for batch in batches:
        s, loss = step(s, batch)
        r, ref_loss = ref(r, jax.device_put(batch, jax.devices()[0]))
        np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5, atol=1e-6)
