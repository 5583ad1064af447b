"""Trace and lower a user function to StableHLO with stock ``jax.jit``."""
from __future__ import annotations

import functools
import hashlib
import re

import jax
from jax.sharding import NamedSharding, PartitionSpec

from alpa_pass import _compat
from alpa_pass.errors import AlpaPassError, TraceError
from alpa_pass.trace.scan_peel import eval_closed, has_layer_stack, peel_layer_scans


def fn_name(fn) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def lower(fn, args, *, in_shardings=None, out_shardings=None, donate_argnums=(), peel_scans: bool = False,
          mesh=None):
    """``jax.jit(fn, ...).lower(*args)`` with every argument kept (module args == arg leaves).

    ``args`` may hold arrays or ``jax.ShapeDtypeStruct``s. ``peel_scans``: lower ``fn`` with the
    last iteration of each layer stack's backward scan run outside its loop (``trace.scan_peel``:
    the same ops, arguments and outputs). ``mesh`` (a LogicalMesh; without ``in_shardings``): the
    mesh the module will be compiled for. A ``custom_partitioning`` op (jax's cuDNN attention)
    lowers inline on one device but as a ``CustomSPMDPartitioning`` custom call on several, so a
    function with one is lowered with its arguments replicated on ``mesh``, as the plan's
    compilation lowers it. Raises TraceError naming ``fn`` when JAX cannot trace or lower it.
    """
    kwargs = dict(keep_unused=True, donate_argnums=tuple(donate_argnums))
    if in_shardings is not None:
        kwargs["in_shardings"] = in_shardings
    if out_shardings is not None:
        kwargs["out_shardings"] = out_shardings
    try:
        traced = _trace(fn, fn, args, kwargs)
        _check_effects(fn, _compat.traced_jaxpr(traced))
        if (in_shardings is None and mesh is not None and mesh.num_devices > 1
                and "custom_partitioning" in _compat.jaxpr_primitive_names(_compat.traced_jaxpr(traced))):
            replicated = NamedSharding(mesh.jax_mesh(), PartitionSpec())
            kwargs["in_shardings"] = jax.tree.map(lambda _: replicated, tuple(args))
            traced = _trace(fn, fn, args, kwargs)
        # one trace for every program; a second (and the peeled one) only where a layer stack is
        if peel_scans and has_layer_stack(_compat.traced_jaxpr(traced)):
            traced = _trace(fn, _peeled(fn, args), args, kwargs)
        return traced.lower()
    except AlpaPassError:  # raised by alpa_pass's own step rewrites (num_micro_batches): already typed
        raise
    except (TypeError, ValueError, jax.errors.JAXTypeError, jax.errors.ConcretizationTypeError) as e:
        raise TraceError(f"jax could not trace {fn_name(fn)}: {type(e).__name__}: {e}. alpa_pass plans "
                         f"what jax.jit can trace; make {fn_name(fn)} jit-compatible first "
                         f"(check it with jax.jit({fn_name(fn)}).lower(*args))") from e


def _check_effects(fn, jaxpr) -> None:
    """TraceError when ``fn`` has effects jax orders with tokens: jax itself runs those on one
    device only (``jit`` over a multi-device sharding raises), so no plan could keep them."""
    ordered = _compat.ordered_effects(jaxpr)
    if ordered:
        raise TraceError(
            f"{fn_name(fn)} has ordered side effects ({', '.join(sorted({type(e).__name__ for e in ordered}))}), "
            f"which jax runs on one device only: make them unordered (jax.debug.print(..., ordered=False), "
            f"the default) or move them out of the parallelized function")


def _trace(fn, body, args, kwargs):
    """``jax.jit(fresh, **kwargs).trace(*args)`` where ``fresh`` calls ``body`` under ``fn``'s name."""
    @functools.wraps(fn)  # keeps fn's signature, so jax names arguments after fn's parameters
    def fresh(*a):  # a new function object: jax's lowering cache hands back *shared* modules,
        return body(*a)  # and emission edits the module in place
    return jax.jit(fresh, **kwargs).trace(*args)


def _peeled(fn, args):
    """``fn`` computed from its jaxpr with its layer stacks' backward scans peeled (``scan_peel``),
    or ``fn`` itself when it has none."""
    trees = []

    def flat(*a):  # (make_jaxpr's return_shape would build ShapeDtypeStructs: jax 0.12 warns on weak types)
        leaves, tree = jax.tree.flatten(fn(*a))
        trees.append(tree)
        return leaves

    peeled = peel_layer_scans(jax.make_jaxpr(flat)(*jax.tree.map(_canonical, args)))
    if peeled is None:
        return fn

    def run(*a):
        return jax.tree.unflatten(trees[0], eval_closed(peeled, *jax.tree.leaves(a)))
    return run


def _canonical(x) -> jax.ShapeDtypeStruct:
    """``leaf_aval(x)`` with the dtype jax computes in (float64 is float32 without x64): what
    ``jax.jit`` traces a float64 argument as, silently (``make_jaxpr`` would warn)."""
    aval = leaf_aval(x)
    if is_prng_key(aval):
        return aval
    return jax.ShapeDtypeStruct(aval.shape, jax.dtypes.canonicalize_dtype(aval.dtype), weak_type=aval.weak_type)


def output_ties(args, outputs) -> list[tuple[int, int]]:
    """Pairs (output leaf index, input leaf index) that should share a sharding.

    ``outputs`` is the output pytree (arrays or ``ShapeDtypeStruct``s, e.g. ``lowered.out_info``).
    An output subtree (the whole output, or an element of a tuple/list output) with the same tree
    structure and leaf shapes/dtypes as a top-level argument is the new value of that argument
    (``state`` in ``train_step(state, batch) -> (state, loss)``); each argument matches once.
    """
    arg_sigs = [_signature(a) for a in args]
    arg_start = _starts([len(sig[1]) for sig in arg_sigs])
    candidates = [(outputs, 0)]
    if isinstance(outputs, (tuple, list)):
        start = 0
        for child in outputs:
            candidates.append((child, start))
            start += len(jax.tree.leaves(child))
    used, ties = set(), []
    for tree, out_start in candidates:
        sig = _signature(tree)
        for j, arg_sig in enumerate(arg_sigs):
            if j not in used and arg_sig[1] and arg_sig == sig:
                used.add(j)
                ties.extend((out_start + k, arg_start[j] + k) for k in range(len(sig[1])))
                break
    return ties


_TOP_LEVEL_OP = re.compile(r"^  [^ }]")
_FUNC_NAME = re.compile(r"^  func\.func (private |public )?@([\w.$-]+)")
_SYMBOL = re.compile(r"@([\w.$-]+)")


def canonical_text(module_text: str) -> str:
    """Module text that is the same for the same computation however jax named, ordered and
    duplicated its private helper functions: jax numbers them by a process-wide counter
    (``@_where_2`` becomes ``@_where_11`` when step 2 of a training loop lowers again) and emits one
    helper once or twice depending on its caches. Each private function is named by a digest of its
    body with its callees' names already so replaced (``@_h<digest>``); identical functions become
    one definition; definitions are sorted by name."""
    lines = module_text.splitlines()
    chunks, current = [], []
    for line in lines[1:-1]:  # between "module ... {" and the closing "}"
        if _TOP_LEVEL_OP.match(line) and current:
            chunks.append(current)
            current = []
        current.append(line)
    if current:
        chunks.append(current)
    funcs, public, others = {}, [], []
    for chunk in chunks:
        m = _FUNC_NAME.match(chunk[0])
        if m is None:
            others.append("\n".join(chunk))
        else:
            funcs[m.group(2)] = "\n".join(chunk)
            if m.group(1) != "private ":
                public.append(m.group(2))
    names: dict = {}

    def canonical(name):  # jax's helper calls form a DAG: no recursion to guard against
        if name not in names:
            def sub(m):
                sym = m.group(1)
                return "@" + (canonical(sym) if sym in funcs and sym != name and sym not in public else sym)

            body = _SYMBOL.sub(sub, funcs[name].replace(f"@{name}(", "@(", 1))
            names[name] = "_h" + hashlib.sha256(body.encode()).hexdigest()[:16]
        return names[name]

    def renamed(text):
        return _SYMBOL.sub(lambda m: "@" + (canonical(m.group(1)) if m.group(1) in funcs and m.group(1)
                                            not in public else m.group(1)), text)

    private = {canonical(n): renamed(funcs[n]) for n in funcs if n not in public}
    body = others + [renamed(funcs[n]) for n in public] + [private[k] for k in sorted(private)]
    return "\n".join([lines[0] if lines else "", *body, lines[-1] if len(lines) > 1 else ""])


def leaf_aval(x) -> jax.ShapeDtypeStruct:
    """Shape, dtype and weak type of any argument leaf ``jax.jit`` accepts: a jax or numpy array,
    a ``ShapeDtypeStruct`` or aval, or a Python/numpy scalar (``TrainState.step`` is a Python int: a weakly
    typed int32 scalar to jax)."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    aval = x if hasattr(x, "shape") and hasattr(x, "dtype") else jax.typeof(x)  # arrays, avals: as they are
    return jax.ShapeDtypeStruct(tuple(aval.shape), aval.dtype, weak_type=bool(getattr(aval, "weak_type", False)))


def is_prng_key(aval) -> bool:
    """Whether a leaf is a typed PRNG key array (``jax.random.key``, ``nnx.Rngs``): its StableHLO
    value is the key *data*, one or more dims longer than the key array itself."""
    return jax.dtypes.issubdtype(leaf_aval(aval).dtype, jax.dtypes.prng_key)


def _signature(tree):
    """(treedef, (shape, dtype) per leaf), dtypes as jax traces them: a float64 numpy argument
    is a float32 array without x64, so the step's new float32 value of it is its new value."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((tuple(x.shape), _traced_dtype(x.dtype)) for x in map(_shaped, leaves))


def _traced_dtype(dtype) -> str:
    if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):  # typed PRNG keys: as they are
        return str(dtype)
    return str(jax.dtypes.canonicalize_dtype(dtype))


def _shaped(x):
    return x if hasattr(x, "shape") and hasattr(x, "dtype") else jax.typeof(x)


def _starts(sizes):
    out, acc = [], 0
    for s in sizes:
        out.append(acc)
        acc += s
    return out
