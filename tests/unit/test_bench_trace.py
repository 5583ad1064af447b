"""Where a traced step's time goes (benchmarks/step_trace.py): instructions named in the HLO, trace
events summed per device per step, a real profiler trace of a psum step, and a real GPU trace.
tests/data/gpu_trace_h200_gpt_small.json.gz: 3 steps of the small GPT's auto plan on one H200 (jax
0.11.2; ``scripts/gpu_check.sh``, step trace-probe)."""
import gzip
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from benchmarks import report_md, step_trace as trace, summary

HLO = """HloModule jit_step, entry_computation_layout={(f32[8]{0})->f32[8]{0}}

fused_computation {
  param_0 = f32[8]{0} parameter(0)
  ROOT multiply.1 = f32[8]{0} multiply(param_0, param_0)
}

ENTRY main.5 {
  %p = f32[8]{0} parameter(0)
  fusion.3 = f32[8]{0} fusion(p), kind=kLoop, calls=fused_computation
  all-reduce.32 = f32[8]{0} all-reduce(fusion.3), replica_groups={{0,1}}, to_apply=add
  ags = (f32[4]{0}, f32[8]{0}) all-gather-start(fusion.3), dimensions={0}
  agd = f32[8]{0} all-gather-done(ags)
  ROOT %a2a.1 = f32[8]{0} all-to-all(agd), dimensions={0}
}
"""


def test_instructions_are_classified_by_opcode_async_halves_included():
    kinds = trace.instruction_kinds(HLO)
    assert kinds["fusion.3"] == "compute" and kinds["multiply.1"] == "compute" and kinds["p"] == "compute"
    assert kinds["all-reduce.32"] == "all-reduce"
    assert kinds["ags"] == kinds["agd"] == "all-gather"  # a tuple-shaped start and its done
    assert kinds["a2a.1"] == "all-to-all"  # ROOT, %-prefixed


def test_events_named_after_instructions_are_summed_per_device_per_step():
    kinds = trace.instruction_kinds(HLO)
    events = [
        {"ph": "X", "name": "fusion.3", "dur": 3000.0},  # us
        {"ph": "X", "name": "fusion.3", "dur": 1000.0},
        {"ph": "X", "name": "all-reduce.32", "dur": 6000.0},
        {"ph": "X", "name": "agd", "dur": 2000.0},
        {"ph": "X", "name": "ThunkExecutor::Execute", "dur": 99000.0},  # not an instruction
        {"ph": "M", "name": "fusion.3", "dur": 5000.0},  # metadata, not a complete event
    ]
    b = trace.breakdown(events, kinds, num_devices=2, steps=1)
    assert b["compute_ms"] == pytest.approx(2.0)  # 4 ms over 2 devices
    assert b["by_kind"] == {"all-reduce": pytest.approx(3.0), "all-gather": pytest.approx(1.0)}
    assert b["collectives_ms"] == pytest.approx(4.0)
    assert b["events_matched"] == 4


def test_a_traced_psum_step_spends_time_in_its_all_reduce_on_every_device():
    mesh = Mesh(np.array(jax.devices()), ("d",))
    n = len(jax.devices())

    def step(state, batch):
        def local(x, w):
            y = jnp.tanh(x @ w)
            return jax.lax.psum(y, "d")

        out = jax.shard_map(local, mesh=mesh, in_specs=(P("d"), P()), out_specs=P())(batch, state)
        return state + out[:, :1] * 0.0, out.sum()

    sharded = NamedSharding(mesh, P("d"))
    batch = jax.device_put(jnp.ones((64 * n, 64), jnp.float32), sharded)
    state = jnp.full((64, 64), 0.01, jnp.float32)
    jitted = jax.jit(step)
    text = jitted.lower(state, batch).compile().as_text()
    kinds = trace.instruction_kinds(text)
    assert "all-reduce" in kinds.values()
    state, b = trace.step_breakdown(jitted, state, batch, text, steps=2)
    assert b["devices"] == n and b["steps"] == 2
    assert b["events_matched"] >= 2 * n * 2  # a dot (or its fusion) and the all-reduce per device per step
    assert set(b["by_kind"]) == {"all-reduce"}
    assert b["collectives_ms"] > 0 and b["compute_ms"] > 0


def test_the_report_puts_traced_time_beside_the_prediction():
    comm = {"all-reduce": {"count": 1, "result_bytes": 8, "wire_bytes": 8.0}}
    tr = {"compute_ms": 30.0, "collectives_ms": 12.5, "by_kind": {"all-reduce": 12.5}, "events_matched": 9}
    r = {"suite": "gpt", "size": "small", "mesh": {"shape": [2, 4]}, "ran": True, "params": 1,
         "profile": {"path": "p.json", "key": "k"},
         "methods": {"auto": {"comm": comm, "memory": {"peak": 1}, "timing": {"median_s": 0.05}, "trace": tr,
                              "predicted": {"compute": 0.02, "communication": 0.002, "resharding": 0.001}},
                     "dp": {"comm": comm, "memory": {"peak": 1}, "timing": {"median_s": 0.06}}},
         "cost_model": {"auto_objective": 0.023, "baselines": {"dp": {"objective": 0.03, "model": "merged"}}}}
    rows = summary.trace_rows(r)
    assert [t["method"] for t in rows] == ["auto"]  # dp was not traced
    assert rows[0]["predicted_compute_ms"] == pytest.approx(20.0)
    assert rows[0]["predicted_comm_ms"] == pytest.approx(3.0)
    table = report_md.trace_table(r)
    assert "| auto | 50.0 | 20.0 | 30.0 | 3.0 | 12.5 | all-reduce 12.5 |" in table
    del r["profile"]  # unit costs: the objective is not in seconds, nothing to put beside
    assert summary.trace_rows(r)[0]["predicted_compute_ms"] is None


def test_a_gpu_trace_counts_the_kernels_on_the_device_lanes_and_nccl_by_name():
    path = os.path.join(os.path.dirname(__file__), "..", "data", "gpu_trace_h200_gpt_small.json.gz")
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    b = trace.gpu_breakdown(events, num_devices=1, steps=3)
    # every kernel of the CUDA graph: 453 events, 1113.376 us in all on the GPU's compute stream; the
    # host's python and PjRt events (thousands, hundreds of ms) are not the device's time
    assert b["events_matched"] == 453
    assert b["compute_ms"] == pytest.approx(1.113376 / 3, rel=1e-6)
    assert b["collectives_ms"] == 0 and b["by_kind"] == {}
    # NCCL's kernels, as a multi-GPU step would show them beside those
    extra = [{"ph": "X", "pid": 7, "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "dur": 300.0},
             {"ph": "X", "pid": 7, "name": "ncclDevKernel_SendRecv", "dur": 150.0},
             {"ph": "X", "pid": 8, "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "dur": 999.0},  # host pid
             {"ph": "M", "pid": 7, "name": "process_name", "args": {"name": "/device:GPU:1"}}]
    b2 = trace.gpu_breakdown(events + extra, num_devices=2, steps=3)
    assert b2["by_kind"] == {"all-reduce": pytest.approx(0.3 / 6), "send-recv": pytest.approx(0.15 / 6)}
    assert b2["compute_ms"] == pytest.approx(1.113376 / 6, rel=1e-6)
    assert trace.nccl_kind("ncclDevKernel_AllGather_RING_LL") == "all-gather"
    assert trace.nccl_kind("loop_add_fusion_1") is None
