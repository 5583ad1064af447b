"""A flax (linen) recurrent sequence model that knows nothing of alpa_pass (run it unchanged).

An embedding, ``nn.RNN(nn.OptimizedLSTMCell)`` over time (a ``lax.scan`` inside flax's lifted
scan) and a ``nn.Bidirectional`` GRU, then a per-step classifier trained with optax adamw and
cross-entropy. The step is a bare ``@jax.jit`` over a flax TrainState. Prints one JSON line: the
losses and, per parameter leaf, its path, the number of devices its sharding spans and its spec.
"""
import json

import flax.linen as nn
import jax
import numpy as np
import optax
from flax.training import train_state

VOCAB, EMBED, HIDDEN, SEQ, BATCH, STEPS = 64, 64, 128, 12, 32, 4


class Tagger(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(VOCAB, EMBED)(tokens)
        x = nn.RNN(nn.OptimizedLSTMCell(HIDDEN))(x)
        x = nn.Bidirectional(nn.RNN(nn.GRUCell(HIDDEN)), nn.RNN(nn.GRUCell(HIDDEN)))(x)
        return nn.Dense(VOCAB)(x)


@jax.jit
def train_step(state, tokens, labels):
    def loss_fn(params):
        logits = state.apply_fn({"params": params}, tokens)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def main():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, (BATCH, SEQ), dtype=np.int32)
    labels = np.roll(tokens, 1, axis=1)
    model = Tagger()
    params = model.init(jax.random.key(0), tokens[:1])["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adamw(1e-3))
    losses = []
    for _ in range(STEPS):
        state, loss = train_step(state, tokens, labels)
        losses.append(float(loss))
    leaves = jax.tree_util.tree_flatten_with_path(state.params)[0]
    shardings = [{"path": jax.tree_util.keystr(path), "devices": len(leaf.sharding.device_set),
                  "spec": str(getattr(leaf.sharding, "spec", None))} for path, leaf in leaves]
    print(json.dumps({"losses": losses, "params": shardings, "num_devices": len(jax.devices())}))


if __name__ == "__main__":
    main()
