"""``parallelize``: the explicit front door (close to Alpa's API)."""
from __future__ import annotations

import functools

import jax

from alpa_pass.methods.base import ParallelMethod
from alpa_pass.methods.shard import ShardParallel


def parallelize(fn=None, *, method: ParallelMethod | None = None, donate_argnums=(), static_argnums=()):
    """Parallelize ``fn`` (a function ``jax.jit`` can trace) with ``method``.

    Usable as ``parallelize(fn, method=...)``, ``@parallelize`` or ``@parallelize(method=...)``.
    The default method is ``ShardParallel()`` (all devices as a 1 x N mesh). The returned function
    plans and compiles once per argument structure/shape/dtype (and static argument values) and
    then just runs. Keyword arguments are not supported (pass everything positionally).
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
        if set(donate_argnums) & set(static_argnums):
            raise ValueError(f"an argument cannot be both donated and static: "
                             f"{sorted(set(donate_argnums) & set(static_argnums))}")
        self.fn = fn
        self.method = method
        self.donate_argnums = donate_argnums
        self.static_argnums = static_argnums
        self._cache: dict = {}
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        if kwargs:
            raise TypeError(f"parallelized {self.__name__} got keyword arguments {sorted(kwargs)}; "
                            f"pass them positionally")
        exe = self.get_executable(*args)
        return exe(*self._dynamic(args))

    def get_executable(self, *args):
        """Plan and compile for these arguments (arrays or ``jax.ShapeDtypeStruct``s); run nothing."""
        dyn = self._dynamic(args)
        leaves, treedef = jax.tree.flatten(dyn)
        key = (treedef, tuple(_leaf_key(x) for x in leaves), self._static_key(args))
        exe = self._cache.get(key)
        if exe is None:
            exe = self._build(args, dyn)
            self._cache[key] = exe
        return exe

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

    def _dynamic(self, args):
        return tuple(a for i, a in enumerate(args) if i not in self.static_argnums)

    def _static_key(self, args):
        return tuple((i, args[i]) for i in self.static_argnums if i < len(args))

    def _dynamic_positions(self, argnums, nargs):
        dyn = [i for i in range(nargs) if i not in self.static_argnums]
        return tuple(dyn.index(i) for i in argnums if i in dyn)

    def _bind_static(self, args):
        if not self.static_argnums:
            return self.fn
        static = {i: args[i] for i in self.static_argnums if i < len(args)}
        nargs, fn = len(args), self.fn

        def bound(*dyn):
            it = iter(dyn)
            return fn(*[static[i] if i in static else next(it) for i in range(nargs)])

        bound.__qualname__ = getattr(fn, "__qualname__", "fn")
        return bound


def _leaf_key(x):
    """Shape, dtype and weak type of a leaf (not its sharding: any placement may be fed back)."""
    aval = x if isinstance(x, jax.ShapeDtypeStruct) else jax.typeof(x)
    return tuple(aval.shape), str(aval.dtype), bool(getattr(aval, "weak_type", False))


def _as_tuple(x):
    if isinstance(x, int):
        return (x,)
    return tuple(int(i) for i in x)
