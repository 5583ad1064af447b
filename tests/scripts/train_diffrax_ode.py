"""A neural ODE trained through diffrax, as its neural-ODE example does it: an Equinox MLP vector
field, diffrax's ``diffeqsolve`` (Tsit5, adaptive steps under a PID controller: a while loop
whose trip count depends on the data; gradients through RecursiveCheckpointAdjoint, diffrax's
default: nested checkpointed loops), optax adabelief, ``eqx.filter_value_and_grad`` and
``eqx.filter_jit``. It knows nothing of alpa_pass. Prints one JSON line: the losses and the
devices each parameter's sharding spans."""
import json

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import optax

WIDTH, BATCH, LENGTH, STEPS = 512, 256, 16, 4


class VectorField(eqx.Module):
    mlp: eqx.nn.MLP

    def __init__(self, key):
        self.mlp = eqx.nn.MLP(2, 2, WIDTH, 2, activation=jax.nn.softplus, final_activation=jax.nn.tanh, key=key)

    def __call__(self, t, y, args):
        return self.mlp(y)


class NeuralODE(eqx.Module):
    field: VectorField

    def __call__(self, ts, y0):
        solution = diffrax.diffeqsolve(
            diffrax.ODETerm(self.field), diffrax.Tsit5(), t0=ts[0], t1=ts[-1], dt0=ts[1] - ts[0], y0=y0,
            stepsize_controller=diffrax.PIDController(rtol=1e-3, atol=1e-6), saveat=diffrax.SaveAt(ts=ts))
        return solution.ys


def trajectories(key):
    """Targets: a damped spiral, solved by diffrax from random starts."""
    ts = jnp.linspace(0.0, 2.0, LENGTH)
    y0 = jr.uniform(key, (BATCH, 2), minval=-0.6, maxval=1.0)

    def spiral(t, y, args):
        return jnp.stack([y[1] / (1 + y[1] ** 2), -0.1 * y[0] - y[1]], -1)

    def solve(y):
        return diffrax.diffeqsolve(diffrax.ODETerm(spiral), diffrax.Tsit5(), 0.0, 2.0, 0.1, y,
                                   saveat=diffrax.SaveAt(ts=ts)).ys

    return ts, jax.vmap(solve)(y0)


optim = optax.adabelief(1e-3)


@eqx.filter_value_and_grad
def loss_fn(model, ts, ys):
    predicted = jax.vmap(model, in_axes=(None, 0))(ts, ys[:, 0])
    return jnp.mean((ys - predicted) ** 2)


@eqx.filter_jit
def train_step(model, opt_state, ts, ys):
    loss, grads = loss_fn(model, ts, ys)
    updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_inexact_array))
    return eqx.apply_updates(model, updates), opt_state, loss


def main():
    data_key, model_key = jr.split(jr.key(0))
    ts, ys = trajectories(data_key)
    model = NeuralODE(VectorField(model_key))
    opt_state = optim.init(eqx.filter(model, eqx.is_inexact_array))
    losses = []
    for _ in range(STEPS):
        model, opt_state, loss = train_step(model, opt_state, ts, ys)
        losses.append(float(loss))
    params = jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array))
    print(json.dumps({"losses": losses, "params": [{"devices": len(p.sharding.device_set),
                                                    "spec": str(getattr(p.sharding, "spec", None))} for p in params]}))


if __name__ == "__main__":
    main()
