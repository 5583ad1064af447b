"""Run a compiled pipeshard step: micro-batches through the stages in schedule order, then apply.

Every executable is dispatched asynchronously and nothing waits on the host inside a step, so
stages on disjoint submeshes run concurrently. Values move between submeshes with one batched
``jax.device_put`` per task to the consumer's planned shardings (``transfer_many``; under
``transfer="send_once_gather"`` replicated values are sent split, then all-gathered on arrival).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from alpa_pass.pipeline.compile import PipeshardProgram, compile_pipeshard
from alpa_pass.pipeline.transfer import transfer_many


class PipeshardExecutable:
    """A planned and compiled pipeshard train step; call it like the step.

    Attributes:
      plan: the PipelinePlan (layers, stages, submeshes, predicted costs, schedule).
      program: the PipeshardProgram (executables and their plans).
    """

    def __init__(self, program: PipeshardProgram, in_treedef):
        from alpa_pass.pipeline.report import PipelinePlan

        self.program = program
        self._in_treedef = in_treedef
        self.plan = PipelinePlan.from_program(program)

    def __call__(self, *args):
        leaves, treedef = jax.tree.flatten(args)
        if treedef != self._in_treedef:
            raise TypeError(f"this executable was planned for arguments {self._in_treedef}, got {treedef}")
        p = self.program
        losses, accs = self._run_pipeline(leaves)
        parts = [accs[s][p.stages[s].program.param_inputs.index(self._param_var(s, k))]
                 for k, users in enumerate(p.grad_users) for s in users]
        flat = [*leaves, *losses, *parts]
        shardings = jax.tree.leaves(p.apply.input_shardings[0])
        outs = p.apply(*self._transfer(flat, shardings))
        return jax.tree.unflatten(p.traced.out_tree, list(outs))

    def _transfer(self, xs, shardings) -> list:
        """``xs`` placed with ``shardings`` under the method's transfer mode."""
        return transfer_many(xs, shardings, self.program.method.transfer)

    def _param_var(self, s: int, k: int):
        prog = self.program.stages[s].program
        return next(v for v in prog.param_inputs if prog.sources[v] == ("arg", k))

    def _marker_inputs(self, leaves):
        """Per marker input, its per-micro-batch values (batch leaves are cut along axis 0)."""
        p = self.program
        num = p.method.num_micro_batches
        out = []
        for k, i in enumerate(p.traced.marker_arg):
            x = leaves[i]
            if p.traced.batch_mask[k]:
                out.append(list(_splitter(num)(x)))
            else:
                out.append([x] * num)
        return out

    def _run_pipeline(self, leaves):
        """Issue every task in clock order; returns (per-micro-batch losses, per-stage grad accumulators)."""
        p = self.program
        inputs = self._marker_inputs(leaves)
        acts, cts, res, losses = {}, {}, {}, {}
        accs = [None] * len(p.stages)
        placed = self._place_whole_inputs(inputs)
        for tick in p.ticks:
            for task in tick:
                st = p.stages[task.stage]
                if task.kind == "fwd":
                    self._forward(st, task.micro, inputs, acts, res, losses, placed)
                else:
                    accs[task.stage] = self._backward(st, task.micro, acts, cts, res, accs[task.stage])
        return [losses[m] for m in range(p.method.num_micro_batches)], accs

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

    def _forward(self, st, m, inputs, acts, res, losses, placed):
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
        outs = st.fwd(*self._transfer(vals, shardings))
        names = (*prog.float_outputs, *prog.int_outputs)
        for v, x in zip(names, outs):
            acts[(v, m)] = x
        if prog.loss_output is not None:
            losses[m] = outs[prog.loss_output]
        res[(prog.index, m)] = outs[len(names):]

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
        outs = st.bwd(*self._transfer(vals, shardings))
        n_act = len(prog.act_inputs)
        for v, x in zip(prog.act_inputs, outs[:n_act]):
            cts[(v, m, prog.index)] = x
        return list(outs[n_act:])


@functools.lru_cache(maxsize=None)
def _splitter(num: int):
    """A jitted split of axis 0 into ``num`` equal micro-batches (one dispatch per batch leaf)."""
    return jax.jit(lambda x: tuple(jnp.split(x, num, axis=0)))


def build_pipeshard(fn, args, method) -> PipeshardExecutable:
    """Trace, plan and compile ``fn(*args)`` under ``method`` (a PipeshardParallel)."""
    return PipeshardExecutable(compile_pipeshard(fn, args, method), jax.tree.structure(args))
