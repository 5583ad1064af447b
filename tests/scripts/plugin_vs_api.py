"""Plan one training step through the plugin (a plain ``jax.jit``, run under JAX_PLUGINS=alpa_pass)
and through ``ap.parallelize`` with the same mesh and options; print both plans' figures as JSON.

Environment: JAX_PLUGINS=alpa_pass, ALPA_PASS_MESH=2x4 and ALPA_PASS_REDUCE_SCATTER=1 (set by
the test). The step donates its state (params, opt_state) in both runs. PLUGIN_VS_API_SCAN=1: the
layers are one ``lax.scan`` over stacked params (both paths peel its boundary iterations,
``trace.scan_peel``); the JSON then also has the API plan's objective with peeling off.
"""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

import alpa_pass as ap
import alpa_pass.plugin

SCAN = os.environ.get("PLUGIN_VS_API_SCAN") == "1"
LAYERS, HIDDEN, BATCH = 4 if SCAN else 3, 64, 512
optimizer = optax.adam(1e-3)


def loss_fn(params, x, y):
    if SCAN:
        x, _ = jax.lax.scan(lambda h, layer: (jnp.tanh(h @ layer["kernel"] + layer["bias"]), None), x, params)
        return jnp.mean((x - y) ** 2)
    for i, layer in enumerate(params):
        x = x @ layer["kernel"] + layer["bias"]
        if i + 1 < len(params):
            x = jnp.tanh(x)
    return jnp.mean((x - y) ** 2)


def train_step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def figures(plan) -> dict:
    return {"objective": plan.objective, "peak_bytes": plan.predicted["peak_bytes"],
            "ilp_columns": plan.ilp_size["columns"],
            "input_specs": [str(s) for s in plan.input_specs],
            "output_specs": [str(s) for s in plan.output_specs],
            "reduce_scattered": plan.emit_report.reduce_scattered,
            "constraints": plan.emit_report.inserted}


def arguments():
    keys = jax.random.split(jax.random.key(0), LAYERS)
    params = [{"kernel": jax.random.normal(k, (HIDDEN, HIDDEN), jnp.float32) / np.sqrt(HIDDEN),
               "bias": jnp.zeros((HIDDEN,), jnp.float32)} for k in keys]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, HIDDEN), dtype=np.float32)
    y = rng.standard_normal((BATCH, HIDDEN), dtype=np.float32)
    if SCAN:
        params = jax.tree.map(lambda *a: jnp.stack(a), *params)
    return params, optimizer.init(params), x, y


def main():
    _, _, loss = jax.jit(train_step, donate_argnums=(0, 1))(*arguments())
    [(name, plugin_plan)] = alpa_pass.plugin.plans()
    plugin_loss = float(loss)
    alpa_pass.plugin.shutdown()  # the API's own jax.jit lowerings must not go through the hook
    method = ap.ShardParallel(mesh=ap.LogicalMesh(shape=(2, 4)),
                              option=ap.AutoShardingOption(prefer_reduce_scatter=True))
    step = ap.parallelize(train_step, method=method, donate_argnums=(0, 1))
    exe = step.get_executable(*arguments())
    _, _, loss = exe(*arguments())
    out = {"name": name, "plugin": figures(plugin_plan), "api": figures(exe.plan), "losses": [plugin_loss, float(loss)]}
    if SCAN:
        unpeeled = ap.ShardParallel(mesh=ap.LogicalMesh(shape=(2, 4)), option=ap.AutoShardingOption(prefer_reduce_scatter=True,
                                                                                   peel_layer_scans=False))
        unpeeled_plan = ap.parallelize(train_step, method=unpeeled).plan(*arguments())
        out["api_unpeeled_objective"] = unpeeled_plan.objective
        out["api_unpeeled_columns"] = unpeeled_plan.ilp_size["columns"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
