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

Arguments that arrive in another plan's layouts: those the computation returns no new value of
(an eval step's parameters) keep them (``planner.arrival_pins``), and arriving later in other
layouts of ours they get another plan under the same key (a variant); the others (a train step's
state coming from a jitted init) are resharded on entry through jax's Python dispatch
(``_compat.python_dispatch``: jax's C++ path would pass them as they are).

Arguments committed to the user's own sharding over all devices (a multi-host script's global
batch, arrays ``jax.device_put`` on the user's mesh) are read as they are (``planner.user_pins``);
committed to part of the devices, they keep the computation there, untouched. An untouched
computation that could hang XLA's CPU runtime on simulated devices (a host callback, jaxlib < 0.11's
batched LAPACK) runs on one device even when a plan left its arguments on the plan's mesh.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
import threading

import jax
from jaxlib.mlir import ir

from alpa_pass import _compat
from alpa_pass.errors import AlpaPassError, MeshError
from alpa_pass.plugin.config import PluginConfig, PluginConfigError
from alpa_pass.trace.lower import canonical_text

log = logging.getLogger("alpa_pass")

HEAVY_PRIMITIVES = frozenset({"dot_general", "conv_general_dilated"})
# Primitives through which the user states shardings or devices inside the computation.
SHARDING_PRIMITIVES = frozenset({"sharding_constraint", "shard_map", "device_put", "xla_pmap"})
# Host callbacks whose results (or operands) a plan moves between devices. On simulated CPU
# devices (several in one process) XLA's CPU runtime can hang: device 0 runs the callback while
# the others wait in the collective that broadcasts its result (s36: a pure_callback of a
# [128, 256] activation on 2x4 hung in the plan, as in plain jax.jit with sharded inputs; the
# same step on one device, how plain jit runs the unparallelised script, does not). A callback in
# a ``cond`` branch (Equinox's ``error_if``, in every diffrax solve) runs only on an error: planned.
HOST_CALLBACK_PRIMITIVES = frozenset({"pure_callback", "io_callback"})
# Linear algebra jaxlib runs as LAPACK calls on CPU. Batched, jaxlib < 0.11 splits the batch over
# XLA's intra-op thread pool and waits from a thread of that pool: simulated devices running it at
# once can take every thread and deadlock (s38: PureJaxRL vmapped over seeds, flax's orthogonal
# init a batched QR, hung in the plan; plain jax with the QR input replicated on 8 devices too).
LAPACK_PRIMITIVES = frozenset({"cholesky", "eig", "eigh", "lu", "qr", "geqrf", "geqp3", "householder_product",
                               "schur", "svd", "hessenberg", "tridiagonal", "tridiagonal_solve"})


@dataclasses.dataclass
class Entry:
    """One planned computation: its plan, the full in_shardings tuple and the lowered computation
    (``computation`` None: not planned, lower it untouched, ``why``); ``kept``: the positions of the
    arguments the computation reads (jax drops the others); ``resharding``: the computation as
    run for arguments committed to other layouts of ours (``_compat.python_dispatch``), made at
    the first such call; ``followable``: the positions of the arguments that keep the layout an
    earlier plan left them in (``plugin.planner.followable``): arriving in other layouts of ours,
    they get a plan of their own (a variant under the same cache key)."""

    name: str
    plan: object
    in_shardings: tuple
    computation: object
    kept: tuple = ()
    followable: tuple = ()
    resharding: object = None
    why: str = "planning it failed before"


@dataclasses.dataclass
class Stats:
    """Counts of what the hook did: ``planned`` (new plans), ``reused`` (cached plan handed back),
    ``passed`` (lowered untouched), ``failed`` (planning failed; lowered untouched)."""

    planned: int = 0
    reused: int = 0
    passed: int = 0
    failed: int = 0


_PLACED_APART = re.compile(r"arguments committed to \d+ of the \d+ devices")  # (_placed_apart's reasons)


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
        self._planner = None
        self._local = threading.local()
        self._owned_meshes: set = set()  # mesh_identity() of the meshes of our plans
        self._told: set = set()  # names of steps logged at info as placed apart or tiny

    def __call__(self, original, closed_jaxpr, api_name, fun_name, in_shardings, out_shardings,
                 in_layouts, out_layouts, donated_invars, **kwargs):
        if self.config_error is not None:
            raise self.config_error
        args = (closed_jaxpr, api_name, fun_name, in_shardings, out_shardings, in_layouts,
                out_layouts, donated_invars)
        reason = "inside alpa_pass planning" if getattr(self._local, "busy", False) else (
            self.skip_reason(closed_jaxpr, api_name, out_shardings, kwargs, fun_name)
            or self._placed_apart(in_shardings))
        if reason is None:
            # (a step traced again under our mesh makes tanh's 1 as a reshard: folded, the same
            # program as its first trace, one plan and one executable for both)
            folded = (_compat.fold_retraced_mesh_ops(closed_jaxpr), *args[1:])
            unspecified = tuple(_compat.unspecified() for _ in in_shardings)
            try:
                probe = original(*folded[:3], unspecified, *folded[4:], **kwargs)
            except Exception as e:  # (our rewrite of the program must not cost the user's step)
                if folded[0] is closed_jaxpr:
                    raise
                log.warning("alpa_pass: %s could not be lowered with its retraced no-op equations folded "
                            "(%s: %s); planning it as traced", fun_name, type(e).__name__, e)
                folded = args
                probe = original(*folded[:3], unspecified, *folded[4:], **kwargs)
            key = _cache_key(probe, args, kwargs)
            variants = self._cache.get(key, [])
            entry = next((e for e in variants if self._follows(e, closed_jaxpr, in_shardings)), None)
            # (arguments committed to the user's own shardings are read as they are: planner.user_pins)
            hidden = None if variants else _lapack_in_module(probe)
            if hidden is not None:  # (a library primitive's body is no sub-jaxpr: seen lowered only)
                self._cache[key] = variants = [Entry(fun_name, None, (), None, why=hidden)]
            if entry is None and (not variants or variants[0].computation is not None):
                computation = self._plan_new(key, probe, original, folded, kwargs)
                entry = self._cache[key][-1]
                if entry.computation is None:
                    return computation
                return self._for_arrival(entry, closed_jaxpr, in_shardings)
            if variants:
                entry = entry or variants[0]
                reason = self._reuse_reason(entry, in_shardings, closed_jaxpr.in_avals)
                if reason is None:
                    self.stats.reused += 1
                    log.debug("alpa_pass: %s reuses its plan and executable", fun_name)
                    return self._for_arrival(entry, closed_jaxpr, in_shardings)
        if _PLACED_APART.match(reason) and fun_name not in self._told:
            self._told.add(fun_name)  # (a step the user placed: say so once, not at every call)
            log.info("alpa_pass: %s runs untouched (%s: it runs where they are; pass them uncommitted "
                     "to have it planned)", fun_name, reason)
        elif (reason.startswith("tiny") and fun_name not in self._told
              and _compat.jaxpr_primitive_names(closed_jaxpr) & HEAVY_PRIMITIVES
              and not _compat.defined_in_jax(closed_jaxpr)):
            # (a small step with matmuls, e.g. an eval step at batch 32: once; not jax's own eager
            # functions, jnp.einsum outside a jit, which ALPA_PASS_MIN_BYTES=0 would not plan)
            self._told.add(fun_name)
            log.info("alpa_pass: %s runs untouched on one device (%s; ALPA_PASS_MIN_BYTES=0 plans it)",
                     fun_name, reason)
        else:
            log.debug("alpa_pass: %s runs untouched (%s)", fun_name, reason)
        self.stats.passed += 1
        ours = reason != "inside alpa_pass planning" and any(self._ours(s) for s in in_shardings) and \
            jax.process_count() == 1
        apart = ours and _PLACED_APART.match(reason) is not None
        lowered = None if ours and (apart or _hang_risk(closed_jaxpr)) else original(*args, **kwargs)
        if ours and (lowered is None or _lapack_in_module(lowered)):
            # Arguments a plan left on its mesh would run it on every simulated device, and
            # hang there (r3: a planned step's scalar into a vmapped cholesky: 6 s a step, plain
            # 0.01 s). Lowered as plain jax lowers uncommitted arguments (on the default device,
            # its results uncommitted: a later plan still takes them), they are moved there on
            # entry (Python dispatch). So are they beside a batch the user committed to one device
            # (``apart``), where plain jax's uncommitted outputs follow it: lowered as they were,
            # jax refused the mix of devices ("Received incompatible devices").
            log.debug("alpa_pass: %s reads arguments on a plan's mesh; it runs on one device", fun_name)
            in_shardings = tuple(_compat.unspecified() if self._ours(s) else s for s in in_shardings)
            return _compat.python_dispatch(original(*args[:3], in_shardings, *args[4:], **kwargs))
        return lowered

    def _ours(self, sharding) -> bool:
        return not _compat.is_unspecified(sharding) and self.owns(sharding)

    def plan_in_flight(self, *args, **kwargs):
        """The planned computation for a lowering's arguments, or None when it is not planned
        (``_compat.replan_in_flight_lowering``: the lowering that started JAX's backend)."""
        before = self.stats.planned + self.stats.reused
        computation = self(_compat.original_lowering(), *args, **kwargs)
        return computation if self.stats.planned + self.stats.reused > before else None

    def entries(self) -> list[Entry]:
        """Every computation planned (or whose planning failed) so far, in order."""
        return [e for variants in self._cache.values() for e in variants]

    def skip_reason(self, closed_jaxpr, api_name, out_shardings, kwargs, fun_name=None) -> str | None:
        """Why this computation is lowered untouched, or None when it is (or may be) planned.

        ``fun_name``: the jitted function's name; jax names an eager primitive's computation
        after the primitive (an eager ``lax.scan`` is a jit named "scan")."""
        if api_name != "jit":
            return f"api {api_name}"
        if kwargs.get("lowering_platforms") is not None or kwargs.get("pgle_profiler") is not None:
            return "cross-platform or profile-guided lowering"
        if not kwargs["context_mesh"].empty:
            return "inside a user mesh context"
        if not all(_compat.is_unspecified(s) for s in out_shardings):
            return "user out_shardings"
        if any(_compat.jit_given_in_shardings() or ()):
            return "user in_shardings"
        if _compat.on_explicit_mesh(closed_jaxpr):
            return "arguments typed on the user's mesh (explicit sharding)"
        effects = _compat.unplannable_effects(closed_jaxpr)  # (unordered callbacks: planned)
        if effects:
            return f"side effects ({', '.join(sorted({type(e).__name__ for e in effects}))})"
        eqns = closed_jaxpr.jaxpr.eqns
        if len(eqns) < 2 and (not _compat.has_subjaxprs(closed_jaxpr) or eqns[0].primitive.name == fun_name):
            # (one call, scan, while or cond that the user jitted is a whole program: a training
            # loop in one jit; called eagerly, jax names its jit after the primitive)
            return "a single operation (eager op)"
        size = sum(_aval_bytes(a) for a in (*closed_jaxpr.in_avals, *closed_jaxpr.out_avals))
        if size < self.config.min_bytes:
            # (a render or eval step that reduces big activations to a small result is not tiny;
            # nor a whole training loop in one jit whose batches are made inside its scan body)
            largest = max((_aval_bytes(v.aval) for e in _compat.jaxpr_eqns(closed_jaxpr) for v in e.outvars),
                          default=0)
            if largest < self.config.min_bytes:
                return (f"tiny: {size} bytes of arguments and results, values of at most {largest} bytes "
                        f"< {self.config.min_bytes}")
        if _compat.defined_in_jax(closed_jaxpr):
            return "a jax library function called eagerly (as jnp.einsum outside a jit)"
        prims = _compat.jaxpr_primitive_names(closed_jaxpr)
        if prims & SHARDING_PRIMITIVES:
            return f"user shardings inside ({', '.join(sorted(prims & SHARDING_PRIMITIVES))})"
        if not prims & HEAVY_PRIMITIVES:
            return "no dot or convolution (an initialiser or elementwise helper)"
        return _hang_risk(closed_jaxpr, prims)

    def _placed_apart(self, in_shardings) -> str | None:
        """Why arguments the user committed to part of the devices (``jax.device_put(x,
        jax.devices()[0])``) keep the computation where they are, or None. Arguments committed to
        a user's sharding over all devices are read as they are by the plan (``planner.user_pins``)."""
        n = len(jax.devices())
        few = {len(s.device_set) for s in in_shardings if not _compat.is_unspecified(s) and not self.owns(s)
               and len(s.device_set) < n}
        return f"arguments committed to {min(few)} of the {n} devices" if few else None

    def owns(self, sharding) -> bool:
        """Whether ``sharding`` is a layout one of our plans produced (a NamedSharding over the mesh
        of a plan): arguments committed to it are resharded into the next plan's layouts on entry,
        unlike the user's own shardings, which are left alone."""
        mesh = getattr(sharding, "mesh", None)
        devices = getattr(mesh, "devices", None)
        return devices is not None and mesh_identity(mesh) in self._owned_meshes

    def _reuse_reason(self, entry: Entry, in_shardings, in_avals) -> str | None:
        """None when ``entry``'s computation can run these arguments, else why not (arguments in
        the user's layouts: the plan read them as they are, in an equal layout on its own mesh)."""
        if entry.computation is None:
            return entry.why
        if not all(_compat.is_unspecified(s) or s == p or self.owns(s) or s.is_equivalent_to(p, len(a.shape))
                   for s, p, a in zip(in_shardings, entry.in_shardings, in_avals)):
            return "arguments committed to shardings of the user's, not the plan's"
        return None

    @staticmethod
    def _arrive_as_planned(entry: Entry, positions, closed_jaxpr, in_shardings) -> bool:
        """Whether each argument at ``positions`` arrives uncommitted or in the layout ``entry``
        reads it in."""
        avals = closed_jaxpr.in_avals
        return all(_compat.is_unspecified(in_shardings[i]) or
                   in_shardings[i].is_equivalent_to(entry.in_shardings[i], len(avals[i].shape))
                   for i in positions)

    def _follows(self, entry: Entry, closed_jaxpr, in_shardings) -> bool:
        """Whether ``entry``'s followable arguments arrive as it reads them (else another variant,
        or a new one, follows these layouts)."""
        return self._arrive_as_planned(entry, entry.followable, closed_jaxpr, in_shardings)

    def _for_arrival(self, entry: Entry, closed_jaxpr, in_shardings):
        """``entry``'s computation for arguments with these shardings: itself when every argument
        it reads is uncommitted or committed to the layout it was planned for, else its
        Python-dispatched copy, which reshards them on entry at every call (a jitted init's
        outputs entering the train step; an argument planned elsewhere than an earlier plan
        left it)."""
        if self._arrive_as_planned(entry, entry.kept, closed_jaxpr, in_shardings):
            return entry.computation
        if entry.resharding is None:
            log.debug("alpa_pass: %s is called with arguments in other layouts of ours than its plan's; "
                      "they are resharded on entry (jax's Python dispatch path)", entry.name)
            entry.resharding = _compat.python_dispatch(entry.computation)
        return entry.resharding

    def _plan_new(self, key, probe, original, args, kwargs):
        if self._planner is None:
            # The planner pulls in the C++ core, highspy and the MLIR walkers: imported at the first
            # eligible computation, so that the entry point stays light (plugin/__init__.py).
            from alpa_pass.plugin.planner import PluginPlanner

            self._planner = PluginPlanner(self.config)
        self._local.busy = True
        try:
            plan, in_sh, computation, follow = self._planner.plan(probe, original, args, kwargs, self.stats.planned,
                                                                  owns=self.owns)
            entry = Entry(name=args[2], plan=plan, in_shardings=in_sh, computation=computation,
                          kept=tuple(_compat.kept_var_idx(computation)), followable=follow)
        except (PluginConfigError, MeshError):
            raise
        except Exception as e:
            if isinstance(e, AlpaPassError):
                log.warning("alpa_pass could not plan %s; it runs as plain jax.jit: %s", args[2], e)
            elif self.config.strict:
                raise
            else:  # a bug (ours or XLA's) must not end the user's run
                log.error("alpa_pass: unexpected %s while planning %s; it runs as plain jax.jit (please report "
                          "this; ALPA_PASS_STRICT=1 raises it)", type(e).__name__, args[2], exc_info=True)
            self._cache.setdefault(key, []).append(Entry(args[2], None, (), None))
            self.stats.failed += 1
            return original(*args, **kwargs)
        finally:
            self._local.busy = False
        self._cache.setdefault(key, []).append(entry)
        self._owned_meshes.add(mesh_identity(entry.plan.mesh.jax_mesh()))
        self.stats.planned += 1
        return entry.computation


def _cache_key(probe, args, kwargs):
    """The computation's identity: a digest of the module jax lowers without shardings (the same
    for the first call and for calls that feed committed outputs back in, whose retraced jaxprs
    differ), plus donation, layouts and lowering options."""
    _, api_name, fun_name, _, _, in_layouts, out_layouts, donated = args
    text = canonical_text(_compat.computation_module(probe).operation.get_asm(enable_debug_info=False))
    return (api_name, fun_name, hashlib.sha256(text.encode()).hexdigest(), len(text), tuple(donated),
            tuple(in_layouts), tuple(out_layouts), kwargs["keep_unused"], kwargs["compiler_options_kvs"])


def mesh_identity(mesh) -> tuple:
    """A mesh's identity: its devices in order, axis names and shape (a user's mesh of the same
    devices and names in another shape is not ours)."""
    return tuple(d.id for d in mesh.devices.flat), tuple(mesh.axis_names), tuple(mesh.devices.shape)


def _hang_risk(closed_jaxpr, prims=None) -> str | None:
    """Why running ``closed_jaxpr`` on several simulated CPU devices at once can hang XLA's CPU
    runtime, or None."""
    if not _compat.simulated_cpu_devices():
        return None
    prims = _compat.jaxpr_primitive_names(closed_jaxpr) if prims is None else prims
    if prims & HOST_CALLBACK_PRIMITIVES and \
            _compat.jaxpr_primitive_names(closed_jaxpr, skip_cond_branches=True) & HOST_CALLBACK_PRIMITIVES:
        return "a host callback on simulated CPU devices (XLA's CPU runtime can hang in it)"
    if prims & LAPACK_PRIMITIVES and _compat.batched_lapack_can_hang() and any(
            e.primitive.name in LAPACK_PRIMITIVES and _batched(e) for e in _compat.jaxpr_eqns(closed_jaxpr)):
        return "batched LAPACK linear algebra on simulated CPU devices (jaxlib < 0.11 can deadlock in it)"
    return None


def _lapack_in_module(computation) -> str | None:
    """:func:`_hang_risk`'s batched-LAPACK reason for a lowered computation whose LAPACK calls
    the jaxpr does not show (lineax's GMRES runs its QR inside Equinox's own primitive, whose body
    is no sub-jaxpr: a vmapped solve deadlocked on 1x8), or None."""
    if not _compat.batched_lapack_can_hang():
        return None
    stack = [_compat.computation_module(computation).operation]
    while stack:
        op = stack.pop()
        for region in op.regions:
            for block in region.blocks:
                stack.extend(o.operation for o in block.operations)
        if op.name == "stablehlo.custom_call" and \
                ir.StringAttr(op.attributes["call_target_name"]).value.startswith("lapack_") and \
                any(_prod(ir.RankedTensorType(v.type).shape[:-2]) > 1 for v in op.operands):
            return "batched LAPACK linear algebra on simulated CPU devices (jaxlib < 0.11 can deadlock in it)"
    return None


def _batched(eqn) -> bool:
    """Whether a linear-algebra equation works on a batch of more than one matrix."""
    shape = getattr(eqn.invars[0].aval, "shape", ()) if eqn.invars else ()
    return _prod(shape[:-2]) > 1


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
