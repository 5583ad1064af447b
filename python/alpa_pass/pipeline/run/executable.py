"""Run a compiled pipeshard step: micro-batches through the stages in schedule order, then the
apply executables (per stage, on its submesh; a cross-stage one only for cross-stage equations).

Per stage there are forward, backward and apply executables. In one process every executable is
dispatched asynchronously and nothing waits on the host inside a step, so stages on disjoint
submeshes run concurrently. Under several processes (``mpirun``) every process walks the same
schedule: executables whose devices it does not hold are no-ops there, moves between processes are
collectives (``cross_process``), and each process waits for each of its computations before the
next (``cross_process.settle``), so stages on different processes run concurrently. Every value that crosses submeshes goes through ``transfer_many`` (one batched
``jax.device_put`` per task to the consumer's planned shardings; under
``transfer="send_once_gather"`` replicated values are sent split, then all-gathered on arrival).
The step's outputs stay where the apply executables wrote them: parameters and optimizer state
on their stage's submesh, in the layout the next step's executables read them in. A stacked
``[L, ...]`` leaf whose pieces the stages hold (``trace.stacked_params``) is cut into them on the
way in and joined into one array over the stages' devices on the way out (``run.stacked``).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Literal

from alpa_pass import _compat
from alpa_pass.pipeline.programs.apply_sites import FREE
from alpa_pass.pipeline.compile.pipeshard import PipeshardProgram, compile_pipeshard
from alpa_pass.pipeline.run.cross_process import settle
from alpa_pass.pipeline.run.report import PipelinePlan
from alpa_pass.pipeline.run.stacked import cut_inputs, join_outputs
from alpa_pass.pipeline.run.transfer import assemble_replicas, transfer_many
from alpa_pass.runtime.multiprocess import compare_digests, gather_digests


class PipeshardExecutable:
    """A planned and compiled pipeshard train step; call it like the step.

    Attributes:
      plan: the PipelinePlan (layers, stages, submeshes, predicted costs, schedule).
      program: the PipeshardProgram (executables and their plans).
    """

    def __init__(self, program: PipeshardProgram, in_treedef):
        self.program = program
        self._in_treedef = in_treedef
        self.plan = PipelinePlan.from_program(program)

    def __call__(self, *args):
        return self.call_flat(*jax.tree.flatten(args))

    def call_flat(self, leaves, treedef):
        """``self(*jax.tree.unflatten(treedef, leaves))`` without flattening the arguments again."""
        if treedef != self._in_treedef:
            raise TypeError(f"this executable was planned for arguments {self._in_treedef}, got {treedef}")
        if jax.process_count() > 1:
            leaves = [_host_if_local(x) for x in leaves]
        split = self.program.split
        if split is not None:  # stacked leaves -> the per-piece leaves the stages hold
            leaves = cut_inputs(split, leaves)
        env = self._run_pipeline(leaves)
        env.update(zip(self.program.traced.step.jaxpr.invars, leaves))
        outs = self._run_apply(env)
        if split is None:
            return jax.tree.unflatten(self.program.traced.out_tree, outs)
        return jax.tree.unflatten(split.out_tree, join_outputs(split, outs, self._transfer))

    def place_flat(self, leaves, treedef) -> list:
        """The argument leaves as they are: a pipeline places its inputs per stage and per
        micro-batch at each call (``ParallelizedFunction.preshard_dynamic_args``)."""
        if treedef != self._in_treedef:
            raise TypeError(f"this executable was planned for arguments {self._in_treedef}, got {treedef}")
        return list(leaves)

    def _transfer(self, xs, shardings) -> list:
        """``xs`` placed with ``shardings`` under the method's transfer mode."""
        return transfer_many(xs, shardings, self.program.method.transfer)

    def _run_apply(self, env: dict) -> list:
        """Run the apply executables in order on ``env`` (step inputs and pipeline results by key);
        returns the step's output leaves. FREE outputs come from every stage, assembled in place."""
        p = self.program
        placed = self._place_free_inputs(env)
        free = {}
        for j, a in enumerate(p.apply):
            ins = self._transfer([placed.get((j, k), env.get(k)) for k in a.program.flat_inputs], a.in_shardings)
            groups, at = [], 0
            for g in a.program.inputs:
                groups.append(tuple(ins[at:at + len(g)]))
                at += len(g)
            outs = settle(a.exe(*groups))
            for v, x in zip(a.program.flat_outputs, jax.tree.leaves(outs)):
                if p.sites.site(v) == FREE:
                    free.setdefault(v, []).append(x)
                else:
                    env[v] = x
        out = []
        for v in p.traced.step.jaxpr.outvars:
            if isinstance(v, Literal):
                out.append(jnp.asarray(v.val))
            else:
                out.append(assemble_replicas(free[v], p.free_sharding) if v in free else env[v])
        return out

    def _place_free_inputs(self, env: dict) -> dict:
        """(apply index, var) -> that executable's copy of a FREE step input. Each is placed once
        replicated on all stages' devices and every executable gets a view of its own devices'
        replicas, all before any runs: donating them in one stage never touches another's."""
        p = self.program
        read = {k for a in p.apply for k in a.program.flat_inputs}
        free = [v for v in p.traced.step.jaxpr.invars if v in read and p.sites.site(v) == FREE]
        placed = dict(zip(free, self._transfer([env[v] for v in free], [p.free_sharding] * len(free))))
        out = {}
        for j, a in enumerate(p.apply):
            mine = [(k, sh) for k, sh in zip(a.program.flat_inputs, a.in_shardings) if k in placed]
            views = self._transfer([placed[k] for k, _ in mine], [sh for _, sh in mine])
            out.update(((j, k), x) for (k, _), x in zip(mine, views))
        return out

    def _marker_inputs(self, leaves):
        """Per marker input, its per-micro-batch values (batch leaves are cut along axis 0: host values
        on the host, so each micro-batch is placed straight onto its stage, also across processes)."""
        p = self.program
        num = p.method.num_micro_batches
        out = []
        for k, i in enumerate(p.traced.marker_arg):
            x = leaves[i]
            if p.traced.batch_mask[k] and not isinstance(x, jax.Array):
                out.append(np.split(np.asarray(x), num, axis=0))  # host values: cut on the host
            elif p.traced.batch_mask[k]:
                out.append(list(_splitter(num)(x)))
            else:
                out.append([x] * num)
        return out

    def _run_pipeline(self, leaves) -> dict:
        """Issue every task in clock order; returns the pipeline results by apply key:
        ``("loss", m)``, ``("aux", j, m)`` and ``("grad", k, stage)`` (accumulated gradients)."""
        p = self.program
        inputs = self._marker_inputs(leaves)
        acts, cts, res, results = {}, {}, {}, {}
        accs = [None] * len(p.stages)
        placed = self._place_whole_inputs(inputs)
        for tick in p.ticks:
            for task in tick:
                st = p.stages[task.stage]
                if task.kind == "fwd":
                    self._forward(st, task.micro, inputs, acts, res, results, placed)
                else:
                    accs[task.stage] = self._backward(st, task.micro, acts, cts, res, accs[task.stage])
        for t, st in enumerate(p.stages):
            results.update(((("grad", st.program.sources[v][1], t), x)
                           for v, x in zip(st.program.param_inputs, accs[t] or ())))
        return results

    def _place_whole_inputs(self, inputs) -> dict:
        """(stage, marker input) -> the non-batch input (parameters) placed on that stage, in one batch."""
        keys, vals, shardings = [], [], []
        for st in self.program.stages:
            prog = st.program
            for v, sh in zip((*prog.diff_inputs, *prog.nondiff_inputs), st.in_shardings("fwd")):
                kind, src = prog.sources[v]
                if kind == "arg" and not self.program.traced.batch_mask[src]:
                    keys.append((prog.index, src))
                    vals.append(inputs[src][0])
                    shardings.append(sh)
        return dict(zip(keys, self._transfer(vals, shardings)))

    def _forward(self, st, m, inputs, acts, res, results, placed):
        prog = st.program
        vals = []
        shardings = st.in_shardings("fwd")
        for v, sh in zip((*prog.diff_inputs, *prog.nondiff_inputs), shardings):
            kind, src = prog.sources[v]
            if kind == "act":
                vals.append(acts[(v, m)])
            elif self.program.traced.batch_mask[src]:
                vals.append(inputs[src][m])
            else:
                vals.append(placed[(prog.index, src)])
        outs = settle(st.fwd(*self._transfer(vals, shardings)))
        names = (*prog.float_outputs, *prog.int_outputs)
        for v, x in zip(names, outs):
            acts[(v, m)] = x
        if prog.loss_output is not None:
            results[("loss", m)] = outs[prog.loss_output]
        for j, x in zip(prog.aux_outputs, outs[len(names):]):
            results[("aux", j, m)] = x
        res[(prog.index, m)] = outs[st.functions.num_outputs():]

    def _backward(self, st, m, acts, cts, res, acc):
        prog = st.program
        shardings = st.in_shardings("bwd")
        vals = list(res.pop((prog.index, m)))
        for v in prog.float_outputs:
            vals += [cts.pop((v, m, t)) for t in prog.consumers[v]]
        if acc is None:
            n = len(vals)
            acc = [jax.numpy.zeros(v.aval.shape, v.aval.dtype, device=sh)
                   for v, sh in zip(prog.param_inputs, shardings[n:])]
        vals += list(acc)
        outs = settle(st.bwd(*self._transfer(vals, shardings)))
        n_act = len(prog.act_inputs)
        for v, x in zip(prog.act_inputs, outs[:n_act]):
            cts[(v, m, prog.index)] = x
        return list(outs[n_act:])


def _host_if_local(x):
    """Under several processes: a jax.Array on one device without a mesh (SingleDeviceSharding: an
    eager result such as freshly initialised parameters, which every process computed for itself)
    is a host value, placed by each process for its own devices like a numpy array. Arrays with
    mesh shardings (a step's outputs, ``place_global`` results) are global and stay as they are."""
    if isinstance(x, jax.Array) and _compat.is_single_device_sharding(x.sharding):
        return np.asarray(x)
    return x


@functools.lru_cache(maxsize=None)
def _splitter(num: int):
    """A jitted split of axis 0 into ``num`` equal micro-batches (one dispatch per batch leaf)."""
    return jax.jit(lambda x: tuple(jnp.split(x, num, axis=0)))


def build_pipeshard(fn, args, method, donate_argnums=()) -> PipeshardExecutable:
    """Trace, plan and compile ``fn(*args)`` under ``method`` (a PipeshardParallel); the apply
    executables donate the buffers of the arguments at ``donate_argnums``. With several processes
    the plans are compared (PlanDivergedError on every rank if they differ)."""
    exe = PipeshardExecutable(compile_pipeshard(fn, args, method, donate_argnums), jax.tree.structure(args))
    if jax.process_count() > 1:  # every process must run the same stages, schedule and plans
        name = getattr(fn, "__qualname__", "fn")
        compare_digests(gather_digests(exe.plan.digest), f"pipeline plan of {name}")
    return exe
