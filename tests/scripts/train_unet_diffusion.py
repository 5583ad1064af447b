"""A small diffusion model in flax linen: a UNet of ``Conv`` / ``ConvTranspose`` / ``GroupNorm``
blocks with a sinusoidal time embedding, the epsilon-prediction loss with noise and times drawn
from a key in the step, adamw, and an EMA of the parameters kept in a ``TrainState`` subclass.
It knows nothing of alpa_pass. Prints one JSON line: the losses and the devices each parameter's
sharding spans."""
import json
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState

STEPS = 4


class ResBlock(nn.Module):
    channels: int

    @nn.compact
    def __call__(self, x, temb):
        h = nn.Conv(self.channels, (3, 3))(nn.swish(nn.GroupNorm(8)(x)))
        h = h + nn.Dense(self.channels)(temb)[:, None, None, :]
        h = nn.Conv(self.channels, (3, 3))(nn.swish(nn.GroupNorm(8)(h)))
        skip = nn.Conv(self.channels, (1, 1))(x) if x.shape[-1] != self.channels else x
        return h + skip


class UNet(nn.Module):
    @nn.compact
    def __call__(self, x, t):
        freqs = jnp.exp(-math.log(10000.0) * jnp.arange(32) / 32)
        temb = jnp.concatenate([jnp.sin(t[:, None] * freqs), jnp.cos(t[:, None] * freqs)], -1)
        temb = nn.Dense(128)(nn.swish(nn.Dense(128)(temb)))
        h1 = ResBlock(64)(nn.Conv(64, (3, 3))(x), temb)
        h2 = ResBlock(128)(nn.Conv(128, (3, 3), strides=2)(h1), temb)
        h2 = ResBlock(128)(h2, temb)
        up = nn.ConvTranspose(64, (2, 2), strides=(2, 2))(h2)
        out = ResBlock(64)(jnp.concatenate([up, h1], -1), temb)
        return nn.Conv(x.shape[-1], (3, 3))(nn.swish(nn.GroupNorm(8)(out)))


class DiffusionState(TrainState):
    ema_params: dict


@jax.jit
def train_step(state, images, key):
    t_key, noise_key = jax.random.split(key)
    t = jax.random.uniform(t_key, (images.shape[0],))
    noise = jax.random.normal(noise_key, images.shape)
    signal = jnp.cos(t * math.pi / 2)[:, None, None, None]
    noisy = signal * images + jnp.sqrt(1 - signal ** 2) * noise

    def loss_fn(params):
        return jnp.mean((state.apply_fn(params, noisy, t) - noise) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    state = state.apply_gradients(grads=grads)
    ema = jax.tree.map(lambda e, p: 0.99 * e + 0.01 * p, state.ema_params, state.params)
    return state.replace(ema_params=ema), loss


def main():
    images = jnp.asarray(np.random.default_rng(0).standard_normal((32, 32, 32, 3)), jnp.float32)
    model = UNet()
    params = model.init(jax.random.key(0), images, jnp.zeros(images.shape[0]))
    state = DiffusionState.create(apply_fn=model.apply, params=params, tx=optax.adamw(1e-3), ema_params=params)
    key = jax.random.key(1)
    losses = []
    for i in range(STEPS):
        state, loss = train_step(state, images, jax.random.fold_in(key, i))
        losses.append(float(loss))
    print(json.dumps({"losses": losses, "params": [{"devices": len(p.sharding.device_set),
                                                    "spec": str(getattr(p.sharding, "spec", None))}
                                                   for p in jax.tree.leaves(state.params)]}))


if __name__ == "__main__":
    main()
