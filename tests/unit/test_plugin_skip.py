"""plugin.hook.LoweringHook.skip_reason: which jitted computations run untouched."""
import types

import jax
import jax.numpy as jnp
import pytest

from alpa_pass import _compat
from alpa_pass.plugin.config import PluginConfig
from alpa_pass.plugin.hook import LoweringHook

N = 256  # a 256x256 f32 is 256 KiB: three of them pass min_bytes below


def _reason(fn, *args, fun_name="step"):
    hook = LoweringHook(PluginConfig(min_bytes=1 << 18))
    closed = jax.make_jaxpr(fn)(*args)
    kwargs = {"context_mesh": types.SimpleNamespace(empty=True)}
    return hook.skip_reason(closed, "jit", [_compat.unspecified()] * len(closed.out_avals), kwargs, fun_name)


@pytest.fixture(scope="module")
def w():
    return jnp.ones((N, N))


def test_one_primitive_is_an_eager_op(w):
    assert _reason(jnp.dot, w, w) == "a single operation (eager op)"


@pytest.mark.parametrize("program", [
    lambda w, x: jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=3)[0],
    lambda w, x: jax.lax.fori_loop(0, 3, lambda i, c: jnp.tanh(c @ w), x),
    lambda w, x: jax.jit(lambda a, b: jnp.tanh(a @ b))(x, w),
], ids=["scan", "fori_loop", "jit"])
def test_one_loop_or_call_is_a_program(w, program):
    # (a whole training loop in one jit is a single scan equation: it ran untouched before s35)
    assert len(jax.make_jaxpr(program)(w, w).jaxpr.eqns) == 1
    assert _reason(program, w, w) is None


def test_a_loop_called_eagerly_is_an_eager_op(w):
    # jax compiles an eager lax.scan / fori_loop as a jit named after the primitive
    loop = lambda w, x: jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=3)[0]  # noqa: E731
    assert _reason(loop, w, w, fun_name="scan") == "a single operation (eager op)"


def test_a_loop_without_a_dot_is_still_no_program_to_plan(w):
    assert _reason(lambda x: jax.lax.fori_loop(0, 3, lambda i, c: jnp.sin(c), x), w) == \
        "no dot or convolution (an initialiser or elementwise helper)"


def test_host_callbacks_run_untouched_on_simulated_cpu_devices(w):
    # (XLA's CPU runtime hung on a planned pure_callback of a sharded activation; plain jit runs
    # the step on one device)
    def step(w, x):
        h = jnp.tanh(x @ w)
        m = jax.pure_callback(lambda a: (a * 2).sum(dtype=a.dtype), jax.ShapeDtypeStruct((), h.dtype), h)
        return h.mean() + m

    assert jax.default_backend() == "cpu" and jax.local_device_count() > 1
    assert _reason(step, w, w) == "a host callback on simulated CPU devices (XLA's CPU runtime can hang in it)"
    assert _reason(lambda w, x: jnp.tanh(x @ w).mean(), w, w) is None


def test_a_host_callback_in_a_cond_branch_is_planned(w):
    # (Equinox's error_if, in every diffrax solve: the callback raises only when the predicate
    # holds, so the step runs no callback and cannot hang)
    def step(w, x):
        h = jnp.tanh(x @ w)

        def fail(v):
            return jax.pure_callback(lambda a: a, jax.ShapeDtypeStruct(v.shape, v.dtype), v)

        return jax.lax.cond(jnp.isnan(h).any(), fail, lambda v: v, h).mean()

    assert _reason(step, w, w) is None
