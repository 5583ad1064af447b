"""Every use of JAX internals lives here, checked against the supported versions.

Supported: ``jax>=0.10.2,<0.13`` (0.10.2 on Python 3.11; 0.11/0.12 on Python >= 3.12).
"""
from __future__ import annotations

import threading

import jax

SUPPORTED = ((0, 10, 2), (0, 13, 0))  # [low, high)


def jax_version() -> tuple[int, ...]:
    parts = []
    for p in jax.__version__.split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def is_supported_jax() -> bool:
    return SUPPORTED[0] <= jax_version() < SUPPORTED[1]


def lowered_module(lowered):
    """The mutable StableHLO ``ir.Module`` that ``lowered.compile()`` will compile.

    ``jax.stages.Lowered.compiler_ir()`` returns a *copy* on some versions; the module held by the
    private ``MeshComputation`` is the one compiled, so passes that annotate it must edit that one.
    """
    lowering = getattr(lowered, "_lowering", None)
    module = getattr(lowering, "_hlo", None)
    if module is None:
        raise RuntimeError(
            f"alpa_pass cannot reach the module of a jax.stages.Lowered on jax {jax.__version__}; "
            f"supported versions are >={'.'.join(map(str, SUPPORTED[0]))},<{'.'.join(map(str, SUPPORTED[1]))}")
    return module


def make_ir_context():
    """An MLIR context with every dialect jax modules use (func, stablehlo, chlo, sdy, mhlo).

    jaxlib's public bindings register stablehlo/chlo/sdy but not ``func``; jax's own factory does.
    """
    from jax._src.interpreters import mlir as jax_mlir

    return jax_mlir.make_ir_context()


# --- jax.jit interception (the JAX_PLUGINS=alpa_pass front door) --------------------------------
# ``jax._src.pjit._pjit_lower`` calls ``pxla.lower_sharding_computation`` through the module
# attribute at every lowering of a ``jax.jit`` computation (same signature on jax 0.10.2 and 0.12),
# so replacing that attribute sees every jit's closed jaxpr and in/out shardings before lowering.

_ORIGINAL_LOWERING = None
_ORIGINAL_RESOLVE = None
_ORIGINAL_AOT_CALL = None
_ORIGINAL_CALL_IMPL = None
_JIT_LOWERING = threading.local()  # .given: the in_shardings of the jax.jit being lowered


def install_lowering_hook(callback, owns=None) -> None:
    """Route every ``pxla.lower_sharding_computation`` call to ``callback(original, *args, **kwargs)``.

    ``owns(sharding)``: whether a sharding is one of the callback's layouts; an AOT-compiled
    computation (``jax.jit(f).lower(*args).compile()``), whose call refuses arguments committed to
    other shardings than it was compiled for, moves arguments in such layouts into its own first:
    plain jit would have compiled for where they lie, a plan put them elsewhere. (Such
    computations run through jax's Python dispatch path, which sees every call's arguments.) A
    jit given in_shardings (``jax.jit(f, in_shardings=...)``, ``jax.pmap``'s ``in_axes=None``
    arguments) refuses an argument committed elsewhere too: plain jit's outputs of uncommitted
    arguments are uncommitted and move there silently, so arguments in such layouts move first
    (flax's imagenet example pmaps the state its jitted init returned).

    ``callback`` returns the ``MeshComputation`` (usually by calling ``original``). Installing twice
    replaces the callback; :func:`uninstall_lowering_hook` restores jax's function.
    """
    global _ORIGINAL_LOWERING, _ORIGINAL_RESOLVE, _ORIGINAL_AOT_CALL, _ORIGINAL_CALL_IMPL
    from jax._src import pjit
    from jax._src.interpreters import pxla

    if _ORIGINAL_LOWERING is None:
        _ORIGINAL_LOWERING = pxla.lower_sharding_computation
    original = _ORIGINAL_LOWERING

    def hooked(*args, **kwargs):
        return callback(original, *args, **kwargs)

    pxla.lower_sharding_computation = hooked
    if _ORIGINAL_RESOLVE is None:
        _ORIGINAL_RESOLVE = pjit._resolve_and_lower
    resolve = _ORIGINAL_RESOLVE

    def resolving(args, jaxpr, in_shardings, *rest, **kwargs):
        # (merges the jit's own in_shardings with the arguments' before lowering: remember which
        # were the jit's, for jit_given_in_shardings)
        _JIT_LOWERING.given = in_shardings
        try:
            return resolve(args, jaxpr, in_shardings, *rest, **kwargs)
        finally:
            _JIT_LOWERING.given = None

    pjit._resolve_and_lower = resolving
    if owns is not None:
        if _ORIGINAL_AOT_CALL is None:
            _ORIGINAL_AOT_CALL = (pxla.MeshExecutable.call, pxla.MeshExecutable.create_cpp_call)
        aot_call, cpp_call = _ORIGINAL_AOT_CALL

        def moved(x, s):
            if (isinstance(x, jax.Array) and isinstance(s, jax.sharding.Sharding) and x.committed
                    and owns(x.sharding) and not x.sharding.is_equivalent_to(s, x.ndim)):
                return jax.device_put(x, s)
            return x

        def moving_call(self, *args):
            args = list(args)
            for j, i in enumerate(sorted(self._kept_var_idx)):
                args[i] = moved(args[i], self._in_shardings[j])
            return aot_call(self, *args)

        if _ORIGINAL_CALL_IMPL is None:
            _ORIGINAL_CALL_IMPL = pjit._pjit_call_impl_python
        call_impl = _ORIGINAL_CALL_IMPL

        def moving_impl(*args, in_shardings, **kwargs):
            _check_donated_once(args, kwargs.get("donated_invars"), kwargs.get("name"))
            if len(args) == len(in_shardings):
                args = tuple(moved(x, s) for x, s in zip(args, in_shardings))
            return call_impl(*args, in_shardings=in_shardings, **kwargs)

        pjit._pjit_call_impl_python = moving_impl

        def python_call_if_ours(self, params):
            # (jax's C++ fast path would pass a committed argument in another layout as it is)
            return None if any(owns(s) for s in self._in_shardings) else cpp_call(self, params)

        pxla.MeshExecutable.call = moving_call
        pxla.MeshExecutable.create_cpp_call = python_call_if_ours


def _check_donated_once(args, donated, name) -> None:
    """Raise jax's own error for an array donated twice in one call, or donated and also read
    (``f(donate(a), a)``): on one device XLA refuses it cleanly, but on a mesh of several
    (where a plan puts the arrays) jaxlib crashes the process instead."""
    if not donated or not any(donated):
        return
    first: dict = {}  # id of an array argument -> its first position
    for i, x in enumerate(args):
        if not isinstance(x, jax.Array):  # (a Python scalar becomes a buffer of its own)
            continue
        j = first.setdefault(id(x), i)
        if j != i and (donated[i] or donated[j]):
            what = "donated twice" if donated[i] and donated[j] else "donated and also read"
            raise jax.errors.JaxRuntimeError(
                f"INVALID_ARGUMENT: jit({name}) is given the same array as arguments {j} and {i} "
                f"(flattened) and it is {what}: a donated buffer is consumed by the call. "
                f"Pass a copy (jnp.copy) in one of the places, or do not donate it.")


def jit_given_in_shardings() -> list[bool] | None:
    """During a ``jax.jit`` lowering the hook sees: per argument, whether the jit itself was given
    its in_sharding (``jax.jit(f, in_shardings=...)``), not only the argument committed to one;
    None outside such a lowering (an AOT ``.lower()`` goes the same way)."""
    given = getattr(_JIT_LOWERING, "given", None)
    return None if given is None else [not is_unspecified(s) for s in given]


def replan_in_flight_lowering(callback) -> bool:
    """Let ``callback`` plan the ``jax.jit`` lowering that is under way, if any.

    The plugin is installed during JAX's backend initialisation, which the script's first
    computation may trigger from inside ``lower_sharding_computation``: that call already runs
    jax's own function. Its caller compiles the result next (``pjit._pjit_call_impl_python``), so
    ``MeshComputation.compile`` is wrapped once: for that computation it compiles
    ``callback(*args, **kwargs)`` instead (the lowering's original arguments; ``callback`` returns
    a planned ``MeshComputation`` or None to keep jax's) and keeps the result as the in-flight
    computation's executable, so jax's lowering cache hands back the planned executable later.
    Returns whether a lowering was under way.
    """
    import sys

    from jax._src.interpreters import pxla

    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "lower_sharding_computation"
                                     and frame.f_code.co_filename.endswith("pxla.py")):
        frame = frame.f_back
    outer = None if frame is None else frame.f_back  # the profiler wrapper: wrapper(*args, **kwargs)
    args = None if outer is None else outer.f_locals.get("args")
    kwargs = None if outer is None else outer.f_locals.get("kwargs")
    if not isinstance(args, tuple) or len(args) < 8 or not isinstance(kwargs, dict):
        return False
    original_compile = pxla.MeshComputation.compile

    def compile_once(self, *a, **k):
        pxla.MeshComputation.compile = original_compile
        name = getattr(self, "_name", None)  # "jit(step)" for fun_name "step"
        if a or k or name not in (args[2], f"{args[1]}({args[2]})") or getattr(self, "const_args", None):
            return original_compile(self, *a, **k)
        planned = callback(*args, **kwargs)
        if planned is None:
            return original_compile(self)
        executable = original_compile(planned)
        self._executable = executable
        return executable

    pxla.MeshComputation.compile = compile_once
    return True


def original_lowering():
    """jax's own ``lower_sharding_computation`` (also while the hook is installed)."""
    from jax._src.interpreters import pxla

    return _ORIGINAL_LOWERING if _ORIGINAL_LOWERING is not None else pxla.lower_sharding_computation


def uninstall_lowering_hook() -> None:
    """Restore jax's own functions the hook replaced (no-op when no hook is installed)."""
    global _ORIGINAL_LOWERING, _ORIGINAL_RESOLVE, _ORIGINAL_AOT_CALL, _ORIGINAL_CALL_IMPL
    from jax._src import pjit
    from jax._src.interpreters import pxla

    if _ORIGINAL_LOWERING is not None:
        pxla.lower_sharding_computation = _ORIGINAL_LOWERING
        _ORIGINAL_LOWERING = None
    if _ORIGINAL_RESOLVE is not None:
        pjit._resolve_and_lower = _ORIGINAL_RESOLVE
        _ORIGINAL_RESOLVE = None
    if _ORIGINAL_AOT_CALL is not None:
        pxla.MeshExecutable.call, pxla.MeshExecutable.create_cpp_call = _ORIGINAL_AOT_CALL
        _ORIGINAL_AOT_CALL = None
    if _ORIGINAL_CALL_IMPL is not None:
        pjit._pjit_call_impl_python = _ORIGINAL_CALL_IMPL
        _ORIGINAL_CALL_IMPL = None


def is_unspecified(sharding) -> bool:
    """True for jax's "no sharding given" marker (an uncommitted argument, no in/out_shardings)."""
    from jax._src import sharding_impls

    return isinstance(sharding, sharding_impls.UnspecifiedValue)


def is_single_device_sharding(sharding) -> bool:
    """Whether ``sharding`` places an array on one device without a mesh (an eager result). jax
    0.12.1 deprecates the ``jax.sharding.SingleDeviceSharding`` name for this test."""
    test = getattr(jax.sharding, "is_single_device_sharding", None)
    if test is not None:
        return test(sharding)
    return isinstance(sharding, jax.sharding.SingleDeviceSharding)


def unspecified():
    """jax's "no sharding given" marker, to pass as an in/out sharding."""
    from jax._src import sharding_impls

    return sharding_impls.UNSPECIFIED


def computation_module(computation):
    """The StableHLO ``ir.Module`` a ``MeshComputation`` will compile (edit it in place)."""
    module = getattr(computation, "_hlo", None)
    if module is None:
        raise RuntimeError(f"alpa_pass cannot reach the module of a MeshComputation on jax {jax.__version__}")
    return module


def kept_var_idx(computation) -> list[int]:
    """Positions of the jaxpr inputs that survived dead-argument elimination (module arguments)."""
    return sorted(computation.compile_args["kept_var_idx"])


def python_dispatch(computation):
    """A copy of ``computation`` (a ``MeshComputation``), compiled now, whose executable jax runs
    only through its Python dispatch path, which reshards every argument into the executable's
    input shardings (``pxla.shard_args``).

    For a planned computation called with arguments committed to other layouts of ours: jax
    lowers a ``jax.jit`` without in_shardings with each committed argument's own sharding, and
    the C++ fast path it caches after the first call passes committed buffers as they are, so the
    executable would read shards of the wrong shape (PJRT "RuntimeProgramInputMismatch", then a
    crash). jax caches no fast path for an executable whose ``unsafe_call`` is not an
    ``ExecuteReplicated`` (``pjit._get_fastpath_data``); the copy's is a thin forwarder. The
    compiled XLA executable is shared, not recompiled."""
    import copy

    executable = computation.compile()
    view = copy.copy(executable)
    view._unsafe_call = _PythonOnlyCall(executable.unsafe_call)
    out = copy.copy(computation)
    out._executable = view
    return out


class _PythonOnlyCall:
    """Forwards calls and attributes to an ``ExecuteReplicated`` without being one. An argument
    spanning several processes is resharded first with ``jax.device_put`` (a jitted identity:
    a collective), which ``pxla.shard_args`` refuses to do ("Cannot reshard an input that is not
    fully addressable"); it handles the others."""

    __slots__ = ("_inner",)

    def __init__(self, inner):
        self._inner = inner

    def __call__(self, *args):
        args = list(args)
        shardings = self._inner.in_handler.in_shardings
        for j, i in enumerate(sorted(self._inner.kept_var_idx)):
            x = args[i]
            if (isinstance(x, jax.Array) and not x.is_fully_addressable
                    and not x.sharding.is_equivalent_to(shardings[j], x.ndim)):
                args[i] = jax.device_put(x, shardings[j])
        return self._inner(*args)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def const_args(computation) -> list:
    """Constants the lowering hoisted into leading module arguments (empty unless hoisting is on)."""
    return list(getattr(computation, "const_args", ()))


def simulated_cpu_devices() -> bool:
    """Whether this process drives several CPU devices (``--xla_force_host_platform_device_count``)."""
    return jax.default_backend() == "cpu" and jax.local_device_count() > 1


def jaxpr_primitive_names(closed_jaxpr, *, skip_cond_branches: bool = False) -> set[str]:
    """Names of every primitive in ``closed_jaxpr`` (or an open jaxpr), sub-jaxprs (pjit, scan,
    cond, ...) included; with ``skip_cond_branches``, without the branches of ``cond`` (code that
    runs only when a predicate says so, e.g. Equinox's ``error_if`` callback that raises on a NaN).

    ``device_put`` counts only when it names a device or sharding (not a plain copy, nor a move
    between memory spaces: remat's host-offload policies put saved activations to pinned host
    memory and back)."""
    return {eqn.primitive.name for eqn in jaxpr_eqns(closed_jaxpr, skip_cond_branches=skip_cond_branches)
            if eqn.primitive.name != "device_put" or any(_places(d) for d in eqn.params.get("devices", ()))}


def _places(target) -> bool:
    """Whether a ``device_put`` target names devices: a device, a sharding, or a layout ``Format``
    with a sharding (a memory space, jax's ``MemorySpace`` or a memory-kind transfer, does not)."""
    return isinstance(target, (jax.Device, jax.sharding.Sharding)) or \
        isinstance(getattr(target, "sharding", None), jax.sharding.Sharding)


def jaxpr_eqns(closed_jaxpr, *, skip_cond_branches: bool = False):
    """Every equation of ``closed_jaxpr`` (or an open jaxpr) and of its sub-jaxprs, as
    :func:`jaxpr_primitive_names` walks them."""
    from jax._src import core

    stack = [getattr(closed_jaxpr, "jaxpr", closed_jaxpr)]
    while stack:
        jaxpr = stack.pop()
        for eqn in jaxpr.eqns:
            yield eqn
            if not (skip_cond_branches and eqn.primitive.name == "cond"):
                stack.extend(core.jaxprs_in_params(eqn.params))


def batched_lapack_can_hang() -> bool:
    """Whether a batched LAPACK call (jaxlib's CPU kernels) can deadlock XLA's CPU runtime when
    several simulated devices run it at once: jaxlib < 0.11 splits the batch over the intra-op
    thread pool and blocks waiting for it, from a thread of that pool (0.11 compiled it out)."""
    return jax_version() < (0, 11) and simulated_cpu_devices()


def has_subjaxprs(closed_jaxpr) -> bool:
    """Whether any equation of ``closed_jaxpr`` (or an open jaxpr) holds a jaxpr of its own: a
    call (pjit, custom_jvp_call, ...), a loop or a conditional."""
    from jax._src import core

    return next(iter(core.subjaxprs(getattr(closed_jaxpr, "jaxpr", closed_jaxpr))), None) is not None


def scan_operands(params: dict, invals: list) -> tuple[list, list, list]:
    """(consts, carry, xs) of a ``scan`` equation's operands. jax < 0.12 counts them in
    ``num_consts`` / ``num_carry``; jax 0.12 describes the three groups by a flat tree ``ft_in``."""
    if "num_consts" in params:
        nc, ncarry = int(params["num_consts"]), int(params["num_carry"])
        return list(invals[:nc]), list(invals[nc:nc + ncarry]), list(invals[nc + ncarry:])
    consts, carry, xs = params["ft_in"].update(list(invals)).unpack()
    return list(consts), list(carry), list(xs)


def bind_params(eqn, **changes) -> tuple[tuple, dict]:
    """(sub-functions, params) to re-bind ``eqn``'s primitive with ``changes`` applied
    (``get_bind_params`` gives the params alone for scan on jax 0.10-0.12, and ``(subfuns,
    params)`` for primitives that bind sub-functions)."""
    bound = eqn.primitive.get_bind_params(dict(eqn.params, **changes))
    return bound if isinstance(bound, tuple) else ((), bound)


def scan_info(eqn) -> tuple[int, bool, object]:
    """(length, reverse, body ClosedJaxpr) of a ``scan`` equation. The body's inputs are the
    scan's operands in order (consts, carry, one slice of each xs), its outputs the new carry and
    one slice of each ys."""
    p = eqn.params
    return int(p["length"]), bool(p["reverse"]), p["jaxpr"]


def dce_closed_jaxpr(closed):
    """``closed`` without the equations no output needs (every input kept), as ``jax.jit``'s
    lowering prunes a jaxpr it is handed (``pe.dce_jaxpr``; scans drop unused carries and ys)."""
    from jax._src.interpreters import partial_eval as pe
    from jax.extend.core import ClosedJaxpr

    jaxpr, _ = pe.dce_jaxpr(closed.jaxpr, True, instantiate=True)
    return ClosedJaxpr(jaxpr, closed.consts)


def with_debug_info(closed, like):
    """``closed`` carrying ``like``'s debug info (the argument names and result paths jax writes
    into the lowered module, which plan labels and reports show) when both have as many inputs
    and outputs; else ``closed``. For a program rewritten from ``like`` by tracing it again."""
    info = getattr(like.jaxpr, "debug_info", None)
    if (info is None or len(closed.jaxpr.invars) != len(like.jaxpr.invars)
            or len(closed.jaxpr.outvars) != len(like.jaxpr.outvars)):
        return closed
    return closed.replace(jaxpr=closed.jaxpr.replace(debug_info=info))


def eqn_source(eqn):
    """A context in which equations bound again keep ``eqn``'s user source location and name
    stack (so a rewritten program's ops still point at the user's code in plan labels)."""
    from jax._src import source_info_util

    return source_info_util.user_context(eqn.source_info.traceback, name_stack=eqn.source_info.name_stack)


def traced_jaxpr(traced):
    """The open jaxpr of a ``jax.stages.Traced`` (``jax.jit(f).trace(*args)``): top-level equations
    and input variables (the arguments; on jax >= 0.12 hoisted constants come first). jax 0.10
    holds a ``ClosedJaxpr`` there, jax 0.12 the ``Jaxpr`` itself."""
    return getattr(traced.jaxpr, "jaxpr", traced.jaxpr)


def unplannable_effects(closed_jaxpr) -> list:
    """The effects of ``closed_jaxpr`` other than unordered callbacks.

    ``jax.debug.print`` / ``jax.debug.callback`` and ``io_callback(ordered=False)`` run their
    callback once per step on a sharded ``jit`` too (jax lowers it with a maximal sharding on one
    device); every other effect (ordered callbacks, state) keeps the step as the user wrote it."""
    from jax._src import callback, debugging

    return [e for e in closed_jaxpr.effects if type(e) not in (debugging.DebugEffect, callback.IOEffect)]


def defined_in_jax(closed_jaxpr) -> bool:
    """Whether the jitted function is one of jax's own (``jnp.einsum`` is a jit named
    ``_einsum``): called outside any jit of the user's, e.g. by a model's eager init."""
    import os

    where = getattr(getattr(closed_jaxpr.jaxpr, "debug_info", None), "func_src_info", None) or ""
    path = where.rpartition(" at ")[2].rpartition(":")[0]
    return bool(path) and os.path.abspath(path).startswith(os.path.dirname(jax.__file__) + os.sep)


def on_explicit_mesh(closed_jaxpr) -> bool:
    """Whether an argument's type carries a mesh with Explicit axes (jax's explicit sharding
    mode: arrays typed ``f32[8@data]``): the user's shardings, which jax lowers only under
    ``jax.set_mesh``. (Arrays committed to Auto-axes meshes, ours too, have typed meshes as well.)"""
    explicit = jax.sharding.AxisType.Explicit
    return any(explicit in getattr(getattr(getattr(a, "sharding", None), "mesh", None), "axis_types", ())
               for a in closed_jaxpr.in_avals)


def ordered_effects(closed_jaxpr) -> list:
    """The effects of ``closed_jaxpr`` that jax orders with tokens (e.g. ``jax.debug.print(...,
    ordered=True)``, ``io_callback(..., ordered=True)``): jax runs them on one device only."""
    from jax._src import effects

    return [e for e in closed_jaxpr.effects if effects.ordered_effects.contains(e)]


# (jaxpr rewrites for a step traced again under our mesh: _compat/fold.py)
from alpa_pass._compat import fold as _fold  # noqa: E402

fold_retraced_mesh_ops = _fold.fold_retraced_mesh_ops

