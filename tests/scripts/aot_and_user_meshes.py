"""What a script does besides calling its jitted step; it knows nothing of alpa_pass.

After a jitted init (planned under the plugin):
- ahead-of-time: ``jax.jit(step).lower(shapes).compile()`` (from ``jax.eval_shape``), then called
  with the init's outputs and a frozen argument that never changes layout;
- a mesh of the user's named ``('x', 'y')``, like jax's sharding tutorial, 2x4 over the devices,
  with ``jax.jit(step, in_shardings=...)``;
- arrays on a mesh with Explicit axes passed to a plain ``jax.jit`` outside ``jax.set_mesh``;
- the init's outputs straight into a ``jax.jit`` given ``in_shardings`` and into ``jax.pmap`` with
  ``in_axes=None`` (flax's imagenet example pmaps the state its jitted init returns).
Prints one JSON line: losses, and the specs the user's layouts came back in."""
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P


@jax.jit
def init(key):
    k1, k2 = jax.random.split(key)
    w = jax.random.normal(k1, (512, 512)) * 0.05
    return {"w1": w, "w2": (w @ w.T) * 0.5}, jax.random.normal(k2, (512, 512)) * 0.05


def loss(p, frozen, x):
    return jnp.mean(jnp.tanh(jnp.tanh(x @ p["w1"]) @ frozen @ p["w2"]) ** 2)


def step(p, frozen, x):
    value, grad = jax.value_and_grad(loss)(p, frozen, x)
    return jax.tree.map(lambda a, b: a - 0.1 * b, p, grad), value


def main():
    out = {}
    p, frozen = init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (256, 512))
    compiled = jax.jit(step).lower(*jax.eval_shape(lambda: (p, frozen, x))).compile()
    out["aot"] = []
    for _ in range(4):
        p, value = compiled(p, frozen, x)
        out["aot"].append(float(value))

    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("x", "y"))
    p_sh = {"w1": NamedSharding(mesh, P(None, "y")), "w2": NamedSharding(mesh, P("y", None))}
    f_sh, x_sh = NamedSharding(mesh, P()), NamedSharding(mesh, P("x"))
    p, frozen, x = jax.device_put((p, frozen, x), (p_sh, f_sh, x_sh))
    user_step = jax.jit(step, in_shardings=(p_sh, f_sh, x_sh))
    out["user_mesh"] = []
    for _ in range(3):
        p, value = user_step(p, frozen, x)
        out["user_mesh"].append(float(value))
    out["user_specs"] = [str(p["w1"].sharding.spec), str(p["w2"].sharding.spec)]

    explicit = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    a = jax.device_put(np.ones((512, 512), np.float32), NamedSharding(explicit, P("data")))
    b = jax.device_put(np.full((512, 512), 0.01, np.float32), NamedSharding(explicit, P()))
    out["explicit"] = float(jax.jit(lambda a, b: jnp.tanh(a @ b).sum())(a, b))

    p0, frozen0 = init(jax.random.key(0))  # (plain jit's outputs of uncommitted inputs move freely)
    rep = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P())
    given = jax.jit(lambda p, f: jnp.sum(p["w2"] @ f), in_shardings=({"w1": rep, "w2": rep}, rep))
    out["given"] = float(given(p0, frozen0))
    xs = np.ones((jax.local_device_count(), 4, 512), np.float32)
    pmapped = jax.pmap(lambda p, x: jax.lax.pmean(jnp.sum(x @ p["w2"]), "b"), in_axes=(None, 0), axis_name="b")
    out["pmap"] = np.asarray(pmapped(p0, xs)).tolist()

    # a user bug: the same array donated twice (one device: XLA's clean error; on a mesh, where the
    # planned init left frozen0, a crash; uncommitted, moved onto the mesh twice: it ran)
    twice = jax.jit(lambda a, b: (jnp.tanh(a @ b), b * 2), donate_argnums=(0, 1))
    out["donated_twice"] = []
    for w in (frozen0, jnp.full((512, 512), 0.01, jnp.float32)):
        try:
            twice(w, w)
            out["donated_twice"].append("ran")
        except Exception as e:  # noqa: BLE001 (the type is the point)
            out["donated_twice"].append(type(e).__name__)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
