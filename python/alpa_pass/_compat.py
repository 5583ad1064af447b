"""Every use of JAX internals lives here, checked against the supported versions.

Supported: ``jax>=0.10.2,<0.13`` (0.10.2 on Python 3.11; 0.11/0.12 on Python >= 3.12).
"""
from __future__ import annotations

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


def install_lowering_hook(callback) -> None:
    """Route every ``pxla.lower_sharding_computation`` call to ``callback(original, *args, **kwargs)``.

    ``callback`` returns the ``MeshComputation`` (usually by calling ``original``). Installing twice
    replaces the callback; :func:`uninstall_lowering_hook` restores jax's function.
    """
    global _ORIGINAL_LOWERING
    from jax._src.interpreters import pxla

    if _ORIGINAL_LOWERING is None:
        _ORIGINAL_LOWERING = pxla.lower_sharding_computation
    original = _ORIGINAL_LOWERING

    def hooked(*args, **kwargs):
        return callback(original, *args, **kwargs)

    pxla.lower_sharding_computation = hooked


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
    """Restore jax's own ``lower_sharding_computation`` (no-op when no hook is installed)."""
    global _ORIGINAL_LOWERING
    from jax._src.interpreters import pxla

    if _ORIGINAL_LOWERING is not None:
        pxla.lower_sharding_computation = _ORIGINAL_LOWERING
        _ORIGINAL_LOWERING = None


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

    ``device_put`` counts only when it names a device or sharding (not a plain copy)."""
    from jax._src import core

    names, stack = set(), [getattr(closed_jaxpr, "jaxpr", closed_jaxpr)]
    while stack:
        jaxpr = stack.pop()
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            if name != "device_put" or any(d is not None for d in eqn.params.get("devices", ())):
                names.add(name)
            if not (skip_cond_branches and name == "cond"):
                stack.extend(core.jaxprs_in_params(eqn.params))
    return names


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
    """The effects of ``closed_jaxpr`` other than unordered debug ones.

    ``jax.debug.print`` / ``jax.debug.callback`` (unordered) run their callback once per step on a
    sharded ``jit`` too (jax lowers it with a maximal sharding on one device); every other effect
    (ordered callbacks, ``io_callback``, state) keeps the step as the user wrote it."""
    from jax._src import debugging

    return [e for e in closed_jaxpr.effects if type(e) is not debugging.DebugEffect]


def ordered_effects(closed_jaxpr) -> list:
    """The effects of ``closed_jaxpr`` that jax orders with tokens (e.g. ``jax.debug.print(...,
    ordered=True)``, ``io_callback(..., ordered=True)``): jax runs them on one device only."""
    from jax._src import effects

    return [e for e in closed_jaxpr.effects if effects.ordered_effects.contains(e)]


def fold_retraced_mesh_ops(closed_jaxpr):
    """``closed_jaxpr`` without the no-op equations that jax adds when a step is traced again for
    arguments committed to a mesh (ours, after its first call); the same object when there are none.

    Such a trace runs under that abstract mesh, where jax makes
    - the constant ``1`` of ``tanh``'s and ``sigmoid``'s jvp as ``reshard 1.0`` (``lax._one``: a
      scalar on the mesh, replicated), which a scan body closing over it takes as one more
      constant: each such reshard is replaced by the literal, and scan constants that thereby
      became literals are moved into the scan's body;
    - a broadcasting multiply's operand of the result's shape (``dt * y`` in diffrax's
      ``ODETerm.prod``, vmapped) as ``reshape[sharding=P(None, ...)]`` to its own shape on an
      Auto-axes mesh, and ``jax.jacrev``'s unravelled rows as ``convert_element_type`` to their
      own dtype (``_possible_downcast``): each such identity op is replaced by its operand.
    The same computation as the first trace, in a different program; folded, both traces lower to
    the same module (an LSTM's step, a diffrax neural ODE's, planned once)."""
    from jax.extend import core

    def fold(jaxpr):
        env, eqns, changed = {}, [], False
        for eqn in jaxpr.eqns:
            invars = [env.get(v, v) if isinstance(v, core.Var) else v for v in eqn.invars]
            if (eqn.primitive.name == "reshard" and len(invars) == 1 and isinstance(invars[0], core.Literal)
                    and eqn.outvars[0].aval.shape == ()):
                env[eqn.outvars[0]] = core.Literal(invars[0].val, eqn.outvars[0].aval)
                changed = True
                continue
            if _identity_op(eqn, invars):
                env[eqn.outvars[0]] = invars[0]
                changed = True
                continue
            params, inlined = eqn.params, None
            if eqn.primitive.name == "scan" and any(isinstance(v, core.Literal) for v in invars):
                inlined = _inline_scan_literals(params, invars)
                if inlined is not None:
                    params, invars = inlined
            params, sub_changed = _fold_params(params, fold)  # (after inlining: nested scans see them)
            if inlined is not None or sub_changed or invars != list(eqn.invars):
                eqn = eqn.replace(invars=invars, params=params)
                changed = True
            eqns.append(eqn)
        if not changed:
            return jaxpr, False
        outvars = [env.get(v, v) if isinstance(v, core.Var) else v for v in jaxpr.outvars]
        return jaxpr.replace(eqns=eqns, outvars=outvars), True

    jaxpr, changed = fold(closed_jaxpr.jaxpr)
    return closed_jaxpr.replace(jaxpr=jaxpr) if changed else closed_jaxpr


def _identity_op(eqn, invars) -> bool:
    """A ``reshape`` of a value to its own shape, or a ``convert_element_type`` to its own dtype
    and weak type, whose sharding, if any, names no mesh axis on a mesh whose axes are all Auto
    (it moves and changes nothing)."""
    from jax.extend import core

    name = eqn.primitive.name
    if name not in ("reshape", "convert_element_type") or len(invars) != 1 or not isinstance(invars[0], core.Var):
        return False
    src, dst = invars[0].aval, eqn.outvars[0].aval
    if src.dtype != dst.dtype or src.shape != dst.shape or getattr(src, "weak_type", False) != getattr(
            dst, "weak_type", False):
        return False
    if name == "reshape" and (tuple(eqn.params.get("new_sizes", ())) != tuple(src.shape)
                              or eqn.params.get("dimensions") is not None):
        return False
    sharding = eqn.params.get("sharding")
    if sharding is None:
        return True
    spec, mesh = getattr(sharding, "spec", None), getattr(sharding, "mesh", None)
    if spec is None or mesh is None or any(entry is not None for entry in spec):
        return False
    return all(t == jax.sharding.AxisType.Auto for t in getattr(mesh, "axis_types", ()))


def _fold_params(params: dict, fold) -> tuple[dict, bool]:
    """``params`` with each sub-jaxpr (bare, closed, or a tuple of them: cond's branches) folded."""
    from jax.extend import core

    def one(x):
        if isinstance(x, core.ClosedJaxpr):
            inner, changed = fold(x.jaxpr)
            return (x.replace(jaxpr=inner) if changed else x), changed
        if isinstance(x, core.Jaxpr):
            return fold(x)
        return x, False

    out, changed = dict(params), False
    for k, v in params.items():
        if isinstance(v, tuple) and v and all(isinstance(b, (core.ClosedJaxpr, core.Jaxpr)) for b in v):
            folded = [one(b) for b in v]
            if any(c for _, c in folded):
                out[k], changed = tuple(b for b, _ in folded), True
        else:
            new, c = one(v)
            if c:
                out[k], changed = new, True
    return out, changed


def _inline_scan_literals(params: dict, invals: list):
    """(params, operands) of a scan whose literal constants are substituted into its body and
    dropped from its operands, or None when it has none. jax < 0.12 counts the constants in
    ``num_consts`` and holds the body as a ClosedJaxpr; 0.12 describes the operand groups by a flat
    tree ``ft_in`` and holds a bare Jaxpr."""
    from jax.extend import core

    consts, carry, xs = scan_operands(params, invals)
    drop = [i for i, c in enumerate(consts) if isinstance(c, core.Literal)]
    if not drop:
        return None
    body = params["jaxpr"]
    inner = getattr(body, "jaxpr", body)
    sub = {inner.invars[i]: consts[i] for i in drop}
    eqns = [e.replace(invars=[sub.get(v, v) if isinstance(v, core.Var) else v for v in e.invars])
            for e in inner.eqns]
    outvars = [sub.get(v, v) if isinstance(v, core.Var) else v for v in inner.outvars]
    inner = inner.replace(invars=[v for i, v in enumerate(inner.invars) if i not in drop], eqns=eqns,
                          outvars=outvars)
    kept = [c for i, c in enumerate(consts) if i not in drop]
    out = dict(params, jaxpr=body.replace(jaxpr=inner) if isinstance(body, core.ClosedJaxpr) else inner)
    if "num_consts" in params:
        out["num_consts"] = len(kept)
        if "linear" in params:
            out["linear"] = tuple(v for i, v in enumerate(params["linear"]) if i not in drop)
    else:
        from jax._src import flattree

        _, carry_ft, xs_ft = params["ft_in"].unpack()
        out["ft_in"] = flattree.pack((flattree.nones(len(kept)), carry_ft, xs_ft))
    return out, kept + list(carry) + list(xs)
