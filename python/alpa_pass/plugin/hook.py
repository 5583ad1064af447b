"""The lowering hook: plan eligible ``jax.jit`` computations as they are lowered.

``_compat.install_lowering_hook`` routes every ``pxla.lower_sharding_computation`` call here.
An eligible computation (see :meth:`LoweringHook.skip_reason`) is

1. lowered once as given (no shardings: the module the planner reads),
2. planned (ShardParallel: extract -> C++ build -> HiGHS) over all devices,
3. lowered again with the plan's ``NamedSharding``s as in/out shardings, and its module gets the
   plan's ``sdy.sharding_constraint``s, so the compiled executable's shardings are the plan's.

The resulting ``MeshComputation`` is cached under the computation's structure. The next call of a
training loop feeds the outputs (now committed to the plan's shardings) back in: jax lowers again
with those shardings as in_shardings, and the hook hands back the *same* ``MeshComputation``,
whose executable is already compiled; nothing is re-planned or re-compiled.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time

from alpa_pass import _compat
from alpa_pass.plugin.config import PluginConfig, PluginConfigError

log = logging.getLogger("alpa_pass")

HEAVY_PRIMITIVES = frozenset({"dot_general", "conv_general_dilated"})
# Primitives through which the user states shardings or devices inside the computation.
CALL_PRIMITIVES = frozenset({"jit", "pjit", "closed_call", "core_call", "custom_jvp_call",
                             "custom_vjp_call"})
SHARDING_PRIMITIVES = frozenset({"sharding_constraint", "shard_map", "device_put", "xla_pmap"})


@dataclasses.dataclass
class Entry:
    """One planned computation: its plan, the full in_shardings tuple and the lowered computation
    (``computation`` None: planning failed, lower it untouched)."""

    name: str
    plan: object
    in_shardings: tuple
    computation: object


@dataclasses.dataclass
class Stats:
    """Counts of what the hook did: ``planned`` (new plans), ``reused`` (cached plan handed back),
    ``passed`` (lowered untouched), ``failed`` (planning failed; lowered untouched)."""

    planned: int = 0
    reused: int = 0
    passed: int = 0
    failed: int = 0


class LoweringHook:
    """The callback given to ``_compat.install_lowering_hook``.

    ``config_error``: when set, every lowering raises it (a bad ``ALPA_PASS_*`` value stops the
    program at its first computation instead of running it unparallelized).
    """

    def __init__(self, config: PluginConfig, config_error: Exception | None = None):
        self.config = config
        self.config_error = config_error
        self.stats = Stats()
        self._cache: dict = {}
        self._mesh = None
        self._local = threading.local()

    def __call__(self, original, closed_jaxpr, api_name, fun_name, in_shardings, out_shardings,
                 in_layouts, out_layouts, donated_invars, **kwargs):
        if self.config_error is not None:
            raise self.config_error
        args = (closed_jaxpr, api_name, fun_name, in_shardings, out_shardings, in_layouts,
                out_layouts, donated_invars)
        reason = "inside alpa_pass planning" if getattr(self._local, "busy", False) else \
            self.skip_reason(closed_jaxpr, api_name, out_shardings, kwargs)
        if reason is None:
            unspecified = tuple(_compat.unspecified() for _ in in_shardings)
            probe = original(*args[:3], unspecified, *args[4:], **kwargs)
            key = _cache_key(probe, args, kwargs)
            entry = self._cache.get(key)
            if entry is not None:
                reason = self._reuse_reason(entry, in_shardings)
                if reason is None:
                    self.stats.reused += 1
                    log.debug("alpa_pass: %s reuses its plan and executable", fun_name)
                    return entry.computation
            elif all(_compat.is_unspecified(s) for s in in_shardings):
                return self._plan_new(key, probe, original, args, kwargs)
            else:
                reason = "arguments committed to shardings"
        log.debug("alpa_pass: %s runs untouched (%s)", fun_name, reason)
        self.stats.passed += 1
        return original(*args, **kwargs)

    def entries(self) -> list[Entry]:
        """Every computation planned (or whose planning failed) so far, in order."""
        return list(self._cache.values())

    def skip_reason(self, closed_jaxpr, api_name, out_shardings, kwargs) -> str | None:
        """Why this computation is lowered untouched, or None when it is (or may be) planned."""
        if api_name != "jit":
            return f"api {api_name}"
        if kwargs.get("lowering_platforms") is not None or kwargs.get("pgle_profiler") is not None:
            return "cross-platform or profile-guided lowering"
        if not kwargs["context_mesh"].empty:
            return "inside a user mesh context"
        if not all(_compat.is_unspecified(s) for s in out_shardings):
            return "user out_shardings"
        if closed_jaxpr.effects:
            return "side effects"
        eqns = closed_jaxpr.jaxpr.eqns
        if len(eqns) < 2 and not (eqns and eqns[0].primitive.name in CALL_PRIMITIVES):
            return "a single operation (eager op)"
        size = sum(_aval_bytes(a) for a in (*closed_jaxpr.in_avals, *closed_jaxpr.out_avals))
        if size < self.config.min_bytes:
            return f"tiny: {size} bytes of arguments and results < {self.config.min_bytes}"
        prims = _compat.jaxpr_primitive_names(closed_jaxpr)
        if prims & SHARDING_PRIMITIVES:
            return f"user shardings inside ({', '.join(sorted(prims & SHARDING_PRIMITIVES))})"
        if not prims & HEAVY_PRIMITIVES:
            return "no dot or convolution (an initialiser or elementwise helper)"
        return None

    @staticmethod
    def _reuse_reason(entry: Entry, in_shardings) -> str | None:
        """None when ``entry``'s computation can run these arguments, else why not."""
        if entry.computation is None:
            return "planning it failed before"
        if not all(_compat.is_unspecified(s) or s == p for s, p in zip(in_shardings, entry.in_shardings)):
            return "arguments committed to shardings other than its plan's"
        return None

    def _plan_new(self, key, probe, original, args, kwargs):
        from alpa_pass.errors import AlpaPassError, MeshError

        self._local.busy = True
        try:
            entry = self._plan(probe, original, args, kwargs)
        except (PluginConfigError, MeshError):
            raise
        except AlpaPassError as e:
            log.warning("alpa_pass could not plan %s; it runs as plain jax.jit: %s", args[2], e)
            self._cache[key] = Entry(args[2], None, (), None)
            self.stats.failed += 1
            return original(*args, **kwargs)
        finally:
            self._local.busy = False
        self._cache[key] = entry
        self.stats.planned += 1
        return entry.computation

    def _plan(self, probe, original, args, kwargs) -> Entry:
        """Plan the probe's module, lower with the plan's shardings and insert its constraints."""
        from alpa_pass.emit.constraints import insert_constraints
        from alpa_pass.extract.stablehlo import extract_graph
        from alpa_pass.options import AutoShardingOption
        from alpa_pass.plan.obtain import obtain_plan
        from alpa_pass.plugin.presets import PRESET_METHODS, preset_option, preset_pins
        from alpa_pass.plan.planner import constraint_targets, operand_targets
        from alpa_pass.plan.serialize import fingerprint
        from alpa_pass.runtime.multiprocess import check_same_plan

        closed_jaxpr, _, name = args[:3]
        option = AutoShardingOption(memory_budget_per_device=self.config.memory_budget_bytes,
                                    plan_cache_dir=self.config.cache_dir)
        timings = {}
        t = time.perf_counter()
        if _compat.const_args(probe):
            from alpa_pass.errors import ExtractError
            raise ExtractError("the lowering hoisted constants into arguments; not supported yet")
        kept = _compat.kept_var_idx(probe)
        graph = extract_graph(_compat.computation_module(probe))
        timings["extract"] = time.perf_counter() - t
        in_avals = [closed_jaxpr.in_avals[i] for i in kept]
        ties = _node_ties(graph, in_avals, closed_jaxpr.out_avals)
        module = _compat.computation_module(probe)
        digest = fingerprint(module.operation.get_asm(enable_debug_info=False), in_avals, graph.num_nodes)
        pinned = ()
        if self.config.method in PRESET_METHODS:
            mesh = self.logical_mesh()
            option = preset_option(self.config.method, option)
            pinned = preset_pins(self.config.method, graph, ties, mesh)
            digest = hashlib.sha256(f"{digest}|{self.config.method}|pinned={pinned}".encode()).hexdigest()
        plan = obtain_plan(graph, self.logical_mesh(), option, ties, timings, digest, pinned=pinned)
        mesh = plan.mesh  # the chosen one when ALPA_PASS_MESH=auto searched several
        timings = plan.timings  # obtain_plan starts the plan's timings from a copy
        check_same_plan(plan, "plan of a jax.jit computation")
        t = time.perf_counter()
        in_sh, out_sh = _entry_shardings(mesh, plan, kept, len(closed_jaxpr.in_avals))
        computation = original(*args[:3], in_sh, out_sh, *args[5:], **kwargs)
        plan.emit_report = insert_constraints(_compat.computation_module(computation), graph,
                                              constraint_targets(graph, plan, mesh, option),
                                              operand_dim_shardings=operand_targets(graph, plan, mesh))
        timings["emit"] = time.perf_counter() - t
        log.info("alpa_pass: planned %s on mesh %s in %.3f s (objective %.6g, %d constraints)",
                 name, "x".join(map(str, mesh.shape)), sum(timings.values()), plan.objective,
                 plan.emit_report.inserted)
        if self.config.report_dir:
            from alpa_pass.plugin.report import write_report
            write_report(self.config.report_dir, self.stats.planned, name, plan)
        return Entry(name=name, plan=plan, in_shardings=in_sh, computation=computation)

    def logical_mesh(self):
        """The LogicalMesh over all devices (``ALPA_PASS_MESH`` or ``1 x N``), or for ``auto`` the
        tuple of candidate meshes of the device count; built once."""
        if self._mesh is None:
            import jax

            from alpa_pass.mesh import LogicalMesh

            n = len(jax.devices())
            if self.config.mesh_shape == "auto":
                from alpa_pass.plan.auto_mesh import candidate_meshes

                self._mesh = candidate_meshes(n, tuple(jax.devices()))
                return self._mesh
            shape = self.config.mesh_shape or (1, n)
            if _prod(shape) != n:
                raise PluginConfigError(
                    f"ALPA_PASS_MESH={'x'.join(map(str, shape))} has {_prod(shape)} positions but there "
                    f"are {n} devices; give a shape whose product is {n} (e.g. 1x{n}) or unset it")
            self._mesh = LogicalMesh(shape=shape, devices=tuple(jax.devices()))
        return self._mesh


def _entry_shardings(mesh, plan, kept, num_inputs):
    """(in_shardings over all jaxpr inputs, out_shardings) as NamedShardings on the plan's mesh.

    Inputs dropped as unused get a replicated sharding (jax drops it again)."""
    from jax.sharding import NamedSharding, PartitionSpec

    jmesh = mesh.jax_mesh()
    by_input = dict(zip(kept, plan.input_specs))
    in_sh = tuple(NamedSharding(jmesh, by_input.get(i, PartitionSpec())) for i in range(num_inputs))
    out_sh = tuple(NamedSharding(jmesh, s) for s in plan.output_specs)
    return in_sh, out_sh


def _node_ties(graph, in_avals, out_avals) -> list[tuple[int, int]]:
    """Output/input node pairs to give one sharding: each output leaf ties to the first unused
    input leaf of the same shape and dtype, in order (the new ``state`` of a training step)."""
    import jax

    from alpa_pass.trace.lower import output_ties

    def sds(avals):
        return tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals)

    params, outputs = graph.param_nodes(), graph.output_nodes()
    return [(outputs[o], params[i]) for o, i in output_ties(sds(in_avals), sds(out_avals))]


def _cache_key(probe, args, kwargs):
    """The computation's identity: a digest of the module jax lowers without shardings (the same
    for the first call and for calls that feed committed outputs back in, whose retraced jaxprs
    differ), plus donation, layouts and lowering options."""
    _, api_name, fun_name, _, _, in_layouts, out_layouts, donated = args
    text = str(_compat.computation_module(probe))
    return (api_name, fun_name, hashlib.sha256(text.encode()).hexdigest(), len(text), tuple(donated),
            tuple(in_layouts), tuple(out_layouts), kwargs["keep_unused"], kwargs["compiler_options_kvs"])


def _aval_bytes(aval) -> int:
    shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return 0
    return _prod(shape) * dtype.itemsize


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out
