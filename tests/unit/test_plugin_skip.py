"""plugin.hook.LoweringHook.skip_reason: which jitted computations run untouched."""
import functools
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


@pytest.mark.parametrize("ordered", [False, True])
def test_only_ordered_io_callbacks_are_side_effects_that_keep_a_step_untouched(w, ordered):
    # (an unordered io_callback runs once per step on a sharded jit too, as jax.debug.callback
    # does; an ordered one runs on one device only. On simulated CPU devices the host-callback rule
    # keeps both untouched, for another reason.)
    from jax.experimental import io_callback

    def step(w, x):
        h = jnp.tanh(x @ w)
        return h.mean() + io_callback(lambda a: a, jax.ShapeDtypeStruct((), h.dtype), h.sum(), ordered=ordered)

    assert [type(e).__name__ for e in _compat.unplannable_effects(jax.make_jaxpr(step)(w, w))] == \
        (["OrderedIOEffect"] if ordered else [])
    assert _reason(step, w, w) == ("side effects (OrderedIOEffect)" if ordered else
                                   "a host callback on simulated CPU devices (XLA's CPU runtime can hang in it)")


def test_a_host_callback_in_a_cond_branch_is_planned(w):
    # (Equinox's error_if, in every diffrax solve: the callback raises only when the predicate
    # holds, so the step runs no callback and cannot hang)
    def step(w, x):
        h = jnp.tanh(x @ w)

        def fail(v):
            return jax.pure_callback(lambda a: a, jax.ShapeDtypeStruct(v.shape, v.dtype), v)

        return jax.lax.cond(jnp.isnan(h).any(), fail, lambda v: v, h).mean()

    assert _reason(step, w, w) is None


def test_small_arguments_and_results_with_big_values_inside_are_planned():
    # (NeRF's render_image: a camera pose in, every ray through the MLP, an image out)
    def render(w, c, rays):
        h = jnp.linspace(0.0, 1.0, rays)[:, None] * c[None, :]  # [rays, 64]
        return jnp.tanh(h @ w).sum(axis=1)

    w, c = jnp.ones((N // 4, N // 4)), jnp.ones((N // 4,))  # 16 KiB of arguments
    assert _reason(lambda w, c: render(w, c, 16 * N), w, c) is None  # a 1 MiB activation
    assert _reason(lambda w, c: render(w, c, N // 4), w, c).startswith("tiny: ")


def test_a_training_loop_whose_batches_are_made_inside_its_scan_is_planned():
    # (PureJaxRL's jax.jit(make_train(config))(key): a key in, losses out, the batch (rollouts)
    # made inside the loop body; it was skipped as tiny, its values measured at the top level only)
    def train(key, batch_rows):
        def step(w, k):
            x = jax.random.normal(k, (batch_rows, N // 4))
            loss, g = jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
            return w - 0.1 * g, loss
        return jax.lax.scan(step, jnp.eye(N // 4), jax.random.split(key, 3))[1]

    key = jax.random.key(0)
    assert _reason(lambda k: train(k, 16 * N), key) is None  # a 1 MiB batch inside the body
    assert _reason(lambda k: train(k, N // 4), key).startswith("tiny: ")


def test_a_jax_function_called_eagerly_runs_untouched(w):
    # (flax initialisers call jnp.einsum outside any jit: jax compiles it as a jit named _einsum)
    x = jnp.ones((4, 2, N))
    assert _reason(functools.partial(jnp.einsum, "bij,jk->bki"), x, w, fun_name="_einsum") == \
        "a jax library function called eagerly (as jnp.einsum outside a jit)"
    assert _reason(lambda a, b: jnp.einsum("bij,jk->bki", a, b), x, w) is None  # the user's own


def test_batched_lapack_runs_untouched_on_simulated_cpu_devices_of_old_jaxlib(w):
    # (PureJaxRL vmapped over seeds: flax's orthogonal init is a batched QR; jaxlib 0.10 splits a
    # LAPACK batch over XLA's CPU thread pool from a pool thread: 8 devices at once deadlocked)
    def batched(w, x):
        q = jnp.linalg.qr(x.reshape(4, N // 4, N))[0]
        return jnp.tanh(x @ w).sum() + q.sum()

    def single(w, x):  # one matrix: no batch to split, planned
        return jnp.tanh(x @ w).sum() + jnp.linalg.cholesky(x @ x.T + N * jnp.eye(N)).sum()

    old = _compat.jax_version() < (0, 11)
    assert jax.local_device_count() > 1
    assert _reason(batched, w, w) == ("batched LAPACK linear algebra on simulated CPU devices (jaxlib < 0.11 "
                                      "can deadlock in it)" if old else None)
    assert _reason(single, w, w) is None


def test_arguments_committed_to_part_of_the_devices_keep_it_there():
    """``jax.device_put(x, jax.devices()[2])`` or a user mesh of half the devices: the computation
    runs where the user put its arguments; a user mesh over all devices is planned around
    (planner.user_pins), as are our own layouts and uncommitted arrays."""
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    hook = LoweringHook(PluginConfig())
    devices = jax.devices()
    one = jax.device_put(jnp.zeros(2), devices[2]).sharding  # (jax 0.12 deprecates naming its class)
    half = NamedSharding(Mesh(np.array(devices[:4]), ("d",)), P("d"))
    whole = NamedSharding(Mesh(np.array(devices).reshape(2, 4), ("a", "b")), P("a"))
    assert hook._placed_apart([_compat.unspecified(), one]) == "arguments committed to 1 of the 8 devices"
    assert hook._placed_apart([half, whole]) == "arguments committed to 4 of the 8 devices"
    assert hook._placed_apart([_compat.unspecified(), whole]) is None


def test_a_step_the_user_placed_on_one_device_is_told_once(w, caplog):
    """A heavy step whose arguments the user committed to one device runs there, untouched, and
    the log says so once at info level (it was a debug line: the user saw no parallelism and no
    reason)."""
    import logging

    hook = LoweringHook(PluginConfig(min_bytes=1 << 18))
    one = jax.device_put(jnp.zeros(2), jax.devices()[2]).sharding
    closed = jax.make_jaxpr(lambda a, b: jnp.tanh(a @ b) @ b)(w, w)
    kwargs = {"context_mesh": types.SimpleNamespace(empty=True)}
    lowered = []
    with caplog.at_level(logging.INFO, logger="alpa_pass"):
        for _ in range(2):
            hook(lambda *a, **k: lowered.append(a[3]), closed, "jit", "step", [one, one],
                 [_compat.unspecified()], None, None, None, **kwargs)
    told = [r.getMessage() for r in caplog.records if "untouched" in r.getMessage()]
    assert told == ["alpa_pass: step runs untouched (arguments committed to 1 of the 8 devices: it runs where "
                    "they are; pass them uncommitted to have it planned)"], told
    assert lowered == [[one, one]] * 2 and hook.stats.passed == 2


def test_a_tiny_step_with_matmuls_is_told_once_and_a_tiny_helper_is_not(caplog):
    """A step with matmuls under ALPA_PASS_MIN_BYTES (an eval step at batch 32) runs on one device,
    and the log says why and how to plan it once at info level (it was a debug line: the user saw
    no parallelism and no reason); a tiny helper without one (an optimizer-state init, an eager
    elementwise op) stays a debug line."""
    import logging

    hook = LoweringHook(PluginConfig(min_bytes=1 << 18))
    x = jnp.ones((32, 64))
    kwargs = {"context_mesh": types.SimpleNamespace(empty=True)}
    heavy = jax.make_jaxpr(lambda a, b: jnp.tanh(a @ b) @ b)(x, jnp.ones((64, 64)))
    helper = jax.make_jaxpr(lambda a: jnp.tanh(a) * 2)(x)
    # (jax's own tiny function with a dot, jnp.einsum called eagerly by an init: never planned, so
    # "ALPA_PASS_MIN_BYTES=0 plans it" would be wrong)
    eager_einsum = jax.make_jaxpr(functools.partial(jnp.einsum, "ij,jk,kl->il"))(x, *[jnp.ones((64, 64))] * 2)
    assert _compat.defined_in_jax(eager_einsum)
    with caplog.at_level(logging.INFO, logger="alpa_pass"):
        for name, closed in [("eval_step", heavy), ("eval_step", heavy), ("init", helper),
                             ("_einsum", eager_einsum)]:
            hook(lambda *a, **k: None, closed, "jit", name, [_compat.unspecified()] * len(closed.in_avals),
                 [_compat.unspecified()], None, None, None, **kwargs)
    told = [r.getMessage() for r in caplog.records if "untouched" in r.getMessage()]
    assert told == ["alpa_pass: eval_step runs untouched on one device (tiny: 32768 bytes of arguments and "
                    "results, values of at most 8192 bytes < 262144; ALPA_PASS_MIN_BYTES=0 plans it)"], told
    assert hook.stats.passed == 4


def test_a_remat_offload_policy_is_not_a_user_sharding(w):
    # (the policy's device_puts name memory spaces, not devices: the whole step ran untouched as
    # "user shardings inside (device_put)"); a device_put to a device still is one
    from jax.ad_checkpoint import checkpoint_name

    policy = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=["mid"],
        offload_src="device", offload_dst="pinned_host")

    def step(w, x):
        def loss(w):
            layer = jax.checkpoint(lambda x: checkpoint_name(jnp.tanh(x @ w), "mid") @ w, policy=policy)
            return jnp.mean(layer(x) ** 2)
        return w - 0.1 * jax.grad(loss)(w)

    prims = [e.primitive.name for e in _compat.jaxpr_eqns(jax.make_jaxpr(step)(w, w))]
    assert prims.count("device_put") == 2
    assert _reason(step, w, w) is None
    assert _reason(lambda w, x: jax.device_put(step(w, x), jax.devices()[1]), w, w) == \
        "user shardings inside (device_put)"
