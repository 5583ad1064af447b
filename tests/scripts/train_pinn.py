"""A physics-informed neural network for the 1-D heat equation u_t = k u_xx (flax linen + optax);
it knows nothing of alpa_pass.
The residual uses jax.vmap of jax.grad / jax.hessian of u w.r.t. its inputs; the train step
differentiates that w.r.t. the params (nested differentiation). Prints one JSON line."""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

WIDTH, DEPTH, N_COLL, N_BND, STEPS, KAPPA = 128, 4, 128, 64, 4, 0.1


class MLP(nn.Module):
    @nn.compact
    def __call__(self, xt):
        h = xt
        for _ in range(DEPTH):
            h = jnp.tanh(nn.Dense(WIDTH)(h))
        return nn.Dense(1)(h)[..., 0]


model = MLP()
optimizer = optax.adam(1e-3)


def u_fn(params, x, t):
    return model.apply({"params": params}, jnp.stack([x, t]))


def residual(params, x, t):
    u_t = jax.grad(u_fn, argnums=2)(params, x, t)
    hess = jax.hessian(lambda xt: u_fn(params, xt[0], xt[1]))(jnp.stack([x, t]))
    return u_t - KAPPA * hess[0, 0]


def loss_fn(params, xc, tc, xb, tb, ub):
    r = jax.vmap(residual, in_axes=(None, 0, 0))(params, xc, tc)
    pde = jnp.mean(r ** 2)
    u_b = jax.vmap(u_fn, in_axes=(None, 0, 0))(params, xb, tb)
    bnd = jnp.mean((u_b - ub) ** 2)
    return pde + bnd


@jax.jit
def train_step(params, opt_state, xc, tc, xb, tb, ub):
    loss, grads = jax.value_and_grad(loss_fn)(params, xc, tc, xb, tb, ub)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def main():
    params = model.init(jax.random.key(0), jnp.zeros((2,), jnp.float32))["params"]
    opt_state = optimizer.init(params)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(STEPS):
        xc = rng.uniform(-1, 1, N_COLL).astype(np.float32)
        tc = rng.uniform(0, 1, N_COLL).astype(np.float32)
        # boundary/initial points: half at t=0 (u = sin(pi x)), half at x=+-1 (u = 0)
        xb0 = rng.uniform(-1, 1, N_BND // 2).astype(np.float32)
        xb1 = rng.choice(np.array([-1.0, 1.0], np.float32), N_BND // 2)
        xb = np.concatenate([xb0, xb1]).astype(np.float32)
        tb = np.concatenate([np.zeros(N_BND // 2, np.float32),
                             rng.uniform(0, 1, N_BND // 2).astype(np.float32)])
        ub = np.concatenate([np.sin(np.pi * xb0), np.zeros(N_BND // 2)]).astype(np.float32)
        params, opt_state, loss = train_step(params, opt_state, xc, tc, xb, tb, ub)
        losses.append(float(loss))
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    print(json.dumps({"losses": losses, "params": [
        {"path": jax.tree_util.keystr(p), "devices": len(leaf.sharding.device_set),
         "spec": str(getattr(leaf.sharding, "spec", None))} for p, leaf in leaves]}))


if __name__ == "__main__":
    main()
