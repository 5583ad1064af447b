"""A Haiku training script that knows nothing of alpa_pass (run it unchanged).

``hk.transform_with_state`` over a Linear, ``hk.MultiHeadAttention``, LayerNorm, BatchNorm (its
moving averages in the state), ``hk.dropout`` with ``hk.next_rng_key()`` and ``hk.nets.MLP``;
optax Adam; a bare ``@jax.jit`` step fed a fresh key from ``hk.PRNGSequence`` each step. Prints
one JSON line: the losses and, per parameter leaf, its path, devices and spec.
"""
import json

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax

BATCH, SEQ, HIDDEN, STEPS = 16, 16, 128, 4


def forward(x, is_training):
    h = hk.Linear(HIDDEN)(x)
    h = hk.MultiHeadAttention(num_heads=4, key_size=HIDDEN // 4, w_init=hk.initializers.VarianceScaling(1.0))(h, h, h)
    h = hk.LayerNorm(axis=-1, create_scale=True, create_offset=True)(h)
    h = hk.BatchNorm(create_scale=True, create_offset=True, decay_rate=0.9)(h, is_training)
    if is_training:
        h = hk.dropout(hk.next_rng_key(), 0.1, h)
    return hk.nets.MLP([4 * HIDDEN, HIDDEN])(h).mean(axis=1)


model = hk.transform_with_state(forward)
optimizer = optax.adam(1e-3)


@jax.jit
def train_step(params, state, opt_state, rng, x, y):
    def loss_fn(p):
        out, new_state = model.apply(p, state, rng, x, True)
        return jnp.mean((out - y) ** 2), new_state

    (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), state, opt_state, loss


def main():
    rngs = hk.PRNGSequence(0)
    data = np.random.default_rng(0)
    x = data.standard_normal((BATCH, SEQ, HIDDEN), dtype=np.float32)
    y = data.standard_normal((BATCH, HIDDEN), dtype=np.float32)
    params, state = model.init(next(rngs), x, True)
    opt_state = optimizer.init(params)
    losses = []
    for _ in range(STEPS):
        params, state, opt_state, loss = train_step(params, state, opt_state, next(rngs), x, y)
        losses.append(float(loss))
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    shardings = [{"path": jax.tree_util.keystr(path), "devices": len(leaf.sharding.device_set),
                  "spec": str(getattr(leaf.sharding, "spec", None))} for path, leaf in leaves]
    print(json.dumps({"losses": losses, "params": shardings}))


if __name__ == "__main__":
    main()
