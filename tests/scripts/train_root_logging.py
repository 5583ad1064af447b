"""A script that configures root logging itself (as gemma/kauldron do) and trains a small MLP step;
it knows nothing of alpa_pass."""
import logging

import jax
import jax.numpy as jnp
import numpy as np

logging.basicConfig(level=logging.INFO, format="ROOT %(name)s: %(message)s")


@jax.jit
def train_step(w, x):
    loss, grad = jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
    return w - 0.5 * grad, loss


def main():
    rng = np.random.default_rng(0)
    w, x = jnp.asarray(rng.standard_normal((512, 512), dtype=np.float32)), rng.standard_normal((256, 512), dtype=np.float32)
    for _ in range(2):
        w, loss = train_step(w, x)
    print('{"losses": [%f], "params": []}' % float(loss))


if __name__ == "__main__":
    main()
