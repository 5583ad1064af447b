"""``parallelize``: the explicit front door (close to Alpa's API)."""
from __future__ import annotations

import functools
import inspect

import jax

from alpa_pass.errors import ArgumentError
from alpa_pass.methods.base import ParallelMethod
from alpa_pass.methods.shard import ShardParallel


def parallelize(fn=None, *, method: ParallelMethod | None = None, donate_argnums=(), static_argnums=()):
    """Parallelize ``fn`` (a function ``jax.jit`` can trace) with ``method``.

    Usable as ``parallelize(fn, method=...)``, ``@parallelize`` or ``@parallelize(method=...)``.
    The default method is ``ShardParallel()`` (all devices as a 1 x N mesh). The returned function
    plans and compiles once per argument structure/shape/dtype (and static argument values) and
    then just runs. Keyword arguments are not supported (pass everything positionally).
    ``static_argnums`` / ``donate_argnums`` count as in ``jax.jit``: a negative number counts from
    the last positional parameter (from the last argument of the call when ``fn`` takes
    ``*args``); static argument values must be hashable (ArgumentError otherwise).
    """
    if fn is None:
        return functools.partial(parallelize, method=method, donate_argnums=donate_argnums,
                                 static_argnums=static_argnums)
    return ParallelizedFunction(fn, method or ShardParallel(), _as_tuple(donate_argnums),
                                _as_tuple(static_argnums))


class ParallelizedFunction:
    """The callable ``parallelize`` returns. ``get_executable(*args)`` plans without running."""

    def __init__(self, fn, method, donate_argnums, static_argnums):
        if not callable(fn):
            raise TypeError(f"parallelize expects a callable, got {type(fn).__name__}")
        if not isinstance(method, ParallelMethod):
            raise TypeError(f"parallelize(method=...) takes ShardParallel(...) (or another alpa_pass "
                            f"method), got {type(method).__name__}")
        nparams = _num_positional(fn)
        if nparams is not None:
            static_argnums = _argnums(static_argnums, nparams, "static_argnums", fn)
            donate_argnums = _argnums(donate_argnums, nparams, "donate_argnums", fn)
        _check_disjoint(donate_argnums, static_argnums)
        self.fn = fn
        self.method = method
        self.donate_argnums = donate_argnums
        self.static_argnums = static_argnums
        self._cache: dict = {}
        self._last = None
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        if kwargs:
            raise TypeError(f"parallelized {self.__name__} got keyword arguments {sorted(kwargs)}; "
                            f"pass them positionally")
        exe, leaves, treedef = self._lookup(args)
        return exe.call_flat(leaves, treedef)

    def get_executable(self, *args):
        """Plan and compile for these arguments (arrays or ``jax.ShapeDtypeStruct``s); run nothing."""
        return self._lookup(args)[0]

    def preshard_dynamic_args(self, *args):
        """Alpa's name: the dynamic (non-static) arguments, as a tuple, placed in the layouts the
        executable for ``args`` reads them in (planned and compiled first if new), so that timed
        calls leave out the transfers. A pipeline's (``PipeshardParallel``) come back as they
        are: it places its inputs per stage at each call."""
        exe, leaves, treedef = self._lookup(args)
        return jax.tree.unflatten(treedef, exe.place_flat(leaves, treedef))

    def _lookup(self, args):
        """(the executable for ``args``, planned and compiled on first sight; the dynamic
        arguments' leaves and treedef). Runs on every call: keep it cheap."""
        dyn = self._dynamic(args)
        leaves, treedef = jax.tree.flatten(dyn)
        key = (treedef, tuple(_leaf_key(x) for x in leaves), self._static_key(args))
        exe = self._cache.get(key)
        if exe is None:
            exe = self._build(args, dyn)
            self._cache[key] = exe
        self._last = exe
        return exe, leaves, treedef

    def get_last_executable(self):
        """Alpa's name: the executable of the latest call (or ``get_executable``); RuntimeError
        before the first."""
        if self._last is None:
            raise RuntimeError(f"{self.__name__} has not been called yet: call it (or get_executable) first")
        return self._last

    def plan(self, *args):
        """Plan only (trace, extract, build, solve) and return the Plan; nothing is compiled (the plan
        cache, when `plan_cache_dir` is set, is read and written).

        With ``jax.ShapeDtypeStruct`` arguments this plans models far larger than host memory.
        """
        donate = self._dynamic_positions(self.donate_argnums, len(args))
        return self.method.plan_for(self._bind_static(args), self._dynamic(args), donate)

    @property
    def executables(self) -> list:
        """The executables built so far, one per argument signature, oldest first."""
        return list(self._cache.values())

    @property
    def num_plans(self) -> int:
        """How many argument signatures have been planned (each plan is cached)."""
        return len(self._cache)

    def _build(self, args, dyn):
        donate = self._dynamic_positions(self.donate_argnums, len(args))
        return self.method.build_executable(self._bind_static(args), dyn, donate)

    def _static(self, nargs) -> tuple:
        """The static positions among ``nargs`` arguments (negative ones counted from the end)."""
        return _argnums(self.static_argnums, nargs, None)

    def _dynamic(self, args):
        static = self._static(len(args))
        return tuple(a for i, a in enumerate(args) if i not in static)

    def _static_key(self, args):
        key = tuple((i, args[i]) for i in self._static(len(args)))
        for i, value in key:
            try:
                hash(value)
            except TypeError as e:
                raise ArgumentError(f"static argument {i} of {getattr(self.fn, '__qualname__', 'fn')} "
                                    f"({type(value).__name__}) is not hashable ({e}); static values key the "
                                    f"compiled plans: pass a hashable value (e.g. a tuple) or drop {i} from "
                                    f"static_argnums") from None
        return key

    def _dynamic_positions(self, argnums, nargs):
        static = self._static(nargs)
        argnums = _argnums(argnums, nargs, None)
        _check_disjoint(argnums, static)
        dyn = [i for i in range(nargs) if i not in static]
        return tuple(dyn.index(i) for i in argnums if i in dyn)

    def _bind_static(self, args):
        if not self.static_argnums:
            return self.fn
        static = {i: args[i] for i in self._static(len(args))}
        nargs, fn = len(args), self.fn

        def bound(*dyn):
            it = iter(dyn)
            return fn(*[static[i] if i in static else next(it) for i in range(nargs)])

        bound.__qualname__ = getattr(fn, "__qualname__", "fn")
        return bound


def _leaf_key(x):
    """Shape, dtype and weak type of a leaf (not its sharding: any placement may be fed back).
    Computed on every call: arrays and ShapeDtypeStructs answer from their attributes (a dtype
    object hashes and compares by value); anything else (Python scalars, NumPy values, typed PRNG
    key arrays) through ``jax.typeof``, which also decides their weak type."""
    weak = getattr(x, "weak_type", None)  # (typed PRNG key arrays have none)
    if weak is not None and isinstance(x, (jax.Array, jax.ShapeDtypeStruct)):
        return tuple(x.shape), x.dtype, bool(weak)
    aval = jax.typeof(x)
    return tuple(aval.shape), aval.dtype, bool(aval.weak_type)


def _num_positional(fn) -> int | None:
    """How many positional parameters ``fn`` has; None when it takes ``*args`` (or has no signature)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def _argnums(argnums, n: int, what: str | None, fn=None) -> tuple:
    """``argnums`` as positions in ``range(n)`` (``i < 0`` counts from the end). Out of range:
    ArgumentError naming ``what`` when given (``n`` positional parameters of ``fn``), else dropped
    (a call with fewer arguments, as jax.jit does for ``*args``)."""
    out = []
    for i in argnums:
        j = i + n if i < 0 else i
        if 0 <= j < n:
            out.append(j)
        elif what is not None:
            name = getattr(fn, "__qualname__", "fn")
            raise ArgumentError(f"{what}={tuple(argnums)} names argument {i}, but {name} has {n} positional "
                                f"parameters; use numbers in range({-n}, {n})")
    return tuple(sorted(set(out)))


def _check_disjoint(donate_argnums, static_argnums) -> None:
    both = sorted(set(donate_argnums) & set(static_argnums))
    if both:
        raise ArgumentError(f"arguments {both} are both donated and static; an argument is one or the other: "
                            f"drop them from donate_argnums or from static_argnums")


def _as_tuple(x):
    if isinstance(x, int):
        return (x,)
    return tuple(int(i) for i in x)
