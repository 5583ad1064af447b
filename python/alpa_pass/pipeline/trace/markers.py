"""``mark_pipeline_boundary``, ``grad`` and ``value_and_grad``: markers the pipeline pass finds.

Outside PipeshardParallel tracing they are plain JAX: ``mark_pipeline_boundary()`` does nothing and
``value_and_grad`` is ``jax.value_and_grad``, so the same train step runs under ``jax.jit``. While
the pipeline pass traces a train step, ``value_and_grad(f)(*args)`` becomes one ``grad_marker``
equation carrying ``f`` (its forward is traced separately), and while it traces ``f``,
``mark_pipeline_boundary()`` becomes a ``pipeline_boundary`` equation (no inputs, no outputs).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading

import jax
from jax.extend.core import ClosedJaxpr, Primitive, jaxpr_as_fun

_MODE = threading.local()

boundary_p = Primitive("pipeline_boundary")
boundary_p.multiple_results = True
boundary_p.def_abstract_eval(lambda: [])
boundary_p.def_impl(lambda: [])

grad_marker_p = Primitive("grad_marker")
grad_marker_p.multiple_results = True
grad_marker_p.def_abstract_eval(lambda *args, info: list(info.out_avals))


@dataclasses.dataclass(eq=False)
class GradInfo:
    """What a ``grad_marker`` equation stands for.

    Attributes:
      fun: the user's loss function; ``fun(*args)`` returns a scalar (or ``(scalar, aux)``).
      in_tree: treedef of the ``args`` tuple; the equation's inputs are its leaves.
      diff_mask: per input leaf, whether its gradient is taken (leaves of ``argnums``).
      has_aux, return_value: ``jax.value_and_grad``'s has_aux; ``grad`` returns no value.
      out_avals / out_tree: the equation's outputs, leaves of ``(value, grads)``.
      num_hoisted: trailing inputs that are values ``fun`` closed over (``_hoist_closure``).
    """

    fun: object
    in_tree: object
    diff_mask: tuple
    has_aux: bool
    return_value: bool
    out_avals: tuple
    out_tree: object
    num_hoisted: int = 0


@contextlib.contextmanager
def _mode(name):
    old = getattr(_MODE, "name", None)
    _MODE.name = name
    try:
        yield
    finally:
        _MODE.name = old


def recording_grads():
    """Within: ``value_and_grad``/``grad`` calls become ``grad_marker`` equations."""
    return _mode("grads")


def recording_boundaries():
    """Within: ``mark_pipeline_boundary()`` becomes a ``pipeline_boundary`` equation."""
    return _mode("boundaries")


def mark_pipeline_boundary() -> None:
    """Mark the end of a pipeline layer in the loss function (Alpa's name). A no-op under jax.jit."""
    if getattr(_MODE, "name", None) == "boundaries":
        boundary_p.bind()


def value_and_grad(fun, argnums=0, has_aux: bool = False):
    """``jax.value_and_grad``, visible to PipeshardParallel as the point where gradients are complete."""
    return _grad_fn(fun, argnums, has_aux, return_value=True)


def grad(fun, argnums=0, has_aux: bool = False):
    """``jax.grad``, visible to PipeshardParallel as the point where gradients are complete."""
    return _grad_fn(fun, argnums, has_aux, return_value=False)


def _hoist_closure(fun, args):
    """``(fun2, hoisted)``: ``fun2(*args, *hoisted)`` computes ``fun(*args)`` with the traced values
    ``fun`` closes over (the flax idiom ``def loss_fn(params): ... batch ...`` inside the step)
    passed as extra, non-differentiated arguments, so the pipeline sees them as marker inputs
    instead of constants baked into the loss. Concrete constants stay closed over."""
    with _mode("boundaries"):  # the jaxpr keeps the loss's pipeline_boundary equations
        closed, out_shape = jax.make_jaxpr(fun, return_shape=True)(*args)
    hoisted = [i for i, c in enumerate(closed.consts) if isinstance(c, jax.core.Tracer)]
    if not hoisted:
        return fun, []
    nargs, out_tree = len(jax.tree.leaves(args)), jax.tree.structure(out_shape)

    @functools.wraps(fun)
    def fun2(*all_args):
        consts = list(closed.consts)
        for i, value in zip(hoisted, all_args[len(args):]):
            consts[i] = value
        flat = jax.tree.leaves(all_args[:len(args)])
        assert len(flat) == nargs
        return jax.tree.unflatten(out_tree, jaxpr_as_fun(ClosedJaxpr(closed.jaxpr, consts))(*flat))

    return fun2, [closed.consts[i] for i in hoisted]


def _grad_fn(fun, argnums, has_aux, return_value):
    plain = (jax.value_and_grad if return_value else jax.grad)(fun, argnums=argnums, has_aux=has_aux)

    def wrapped(*args):
        if getattr(_MODE, "name", None) != "grads":
            return plain(*args)
        fun_, hoisted = _hoist_closure(fun, args)
        return _marker(fun_, (*args, *hoisted), argnums, has_aux, return_value, len(hoisted))

    return wrapped


def _marker(fun, args, argnums, has_aux, return_value, num_hoisted):
    """One ``grad_marker`` equation standing for ``value_and_grad(fun, argnums, has_aux)(*args)``."""
    with _mode(None):
        out_shape = jax.eval_shape(jax.value_and_grad(fun, argnums=argnums, has_aux=has_aux), *args)
    leaves, in_tree = jax.tree.flatten(args)
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    mask = []
    for i, a in enumerate(args):
        mask += [i in nums] * len(jax.tree.leaves(a))
    out_leaves, out_tree = jax.tree.flatten(out_shape)
    info = GradInfo(fun, in_tree, tuple(mask), has_aux, return_value,
                    tuple(jax.core.ShapedArray(o.shape, o.dtype) for o in out_leaves), out_tree, num_hoisted)
    value, grads = jax.tree.unflatten(out_tree, grad_marker_p.bind(*leaves, info=info))
    return (value, grads) if return_value else (
        (grads, value[1]) if has_aux else grads)
