"""A user-written top-2 mixture-of-experts in flax linen (GShard-style dispatch with a capacity
factor, load-balancing aux loss collected by sow), 2 MoE layers with residual + LayerNorm, TrainState
+ adam; it knows nothing of alpa_pass."""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

D, FF, E, K, SEQ, BATCH, STEPS, CAP_FACTOR, AUX_W = 128, 256, 8, 2, 16, 32, 4, 1.25, 1e-2


class MoE(nn.Module):
    @nn.compact
    def __call__(self, x):  # x: [B, S, D]
        b, s, d = x.shape
        t = b * s
        tokens = x.reshape(t, d)
        logits = nn.Dense(E, use_bias=False, name="router")(tokens)
        gates = jax.nn.softmax(logits, axis=-1)  # [T, E]
        top_vals, top_idx = jax.lax.top_k(gates, K)  # [T, K]
        top_vals = top_vals / jnp.sum(top_vals, axis=-1, keepdims=True)
        capacity = int(np.ceil(K * t / E * CAP_FACTOR))

        combine = jnp.zeros((t, E, capacity), x.dtype)
        filled = jnp.zeros((E,), jnp.int32)
        for k in range(K):
            mask = jax.nn.one_hot(top_idx[:, k], E, dtype=jnp.int32)  # [T, E]
            pos = jnp.cumsum(mask, axis=0) - 1 + filled[None, :]
            filled = filled + jnp.sum(mask, axis=0)
            mask = mask * (pos < capacity)
            pos_t = jnp.sum(pos * mask, axis=-1)  # [T]
            combine = combine + (top_vals[:, k, None, None] * mask[:, :, None].astype(x.dtype)
                                 * jax.nn.one_hot(pos_t, capacity, dtype=x.dtype)[:, None, :])
        dispatch = (combine > 0).astype(x.dtype)

        # load-balancing loss (Switch/GShard): E * sum_e f_e * p_e with top-1 assignment fractions
        frac = jnp.mean(jax.nn.one_hot(top_idx[:, 0], E, dtype=x.dtype), axis=0)
        prob = jnp.mean(gates, axis=0)
        self.sow("losses", "aux", E * jnp.sum(frac * prob))

        w_in = self.param("w_in", nn.initializers.lecun_normal(batch_axis=(0,)), (E, d, FF))
        w_out = self.param("w_out", nn.initializers.lecun_normal(batch_axis=(0,)), (E, FF, d))
        expert_in = jnp.einsum("tec,td->ecd", dispatch, tokens)
        h = nn.gelu(jnp.einsum("ecd,edf->ecf", expert_in, w_in))
        expert_out = jnp.einsum("ecf,efd->ecd", h, w_out)
        out = jnp.einsum("tec,ecd->td", combine, expert_out)
        return out.reshape(b, s, d)


class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.Dense(D, name="in_proj")(x)
        for i in range(2):
            x = x + MoE(name=f"moe{i}")(nn.LayerNorm(name=f"ln{i}")(x))
        return nn.Dense(D, name="out_proj")(nn.LayerNorm(name="ln_f")(x))


@jax.jit
def train_step(state, x, y):
    def loss_fn(params):
        pred, aux = state.apply_fn({"params": params}, x, mutable=["losses"])
        aux_loss = sum(jax.tree.leaves(aux["losses"]))
        mse = jnp.mean((pred - y) ** 2)
        return mse + AUX_W * aux_loss, mse

    (loss, mse), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    return state.apply_gradients(grads=grads), loss


def main():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, SEQ, D), dtype=np.float32)
    y = rng.standard_normal((BATCH, SEQ, D), dtype=np.float32)
    model = Model()
    params = model.init(jax.random.key(0), x)["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-3))
    losses = []
    for _ in range(STEPS):
        state, loss = train_step(state, x, y)
        losses.append(float(loss))
    leaves = jax.tree_util.tree_flatten_with_path(state.params)[0]
    shardings = [{"path": jax.tree_util.keystr(path), "devices": len(leaf.sharding.device_set),
                  "spec": str(getattr(leaf.sharding, "spec", None)), "shape": list(leaf.shape)}
                 for path, leaf in leaves]
    print(json.dumps({"losses": losses, "params": shardings, "num_devices": len(jax.devices())}))


if __name__ == "__main__":
    main()
