"""The one place that turns what a user said about the mesh into the LogicalMesh(es) to plan for.

``ShardParallel(mesh=...)``, the presets, ``PipeshardParallel(mesh=...)`` and the plugin's
``ALPA_PASS_MESH`` all resolve here.
"""
from __future__ import annotations

import math

import jax

from alpa_pass.driver.auto_mesh import candidate_meshes
from alpa_pass.errors import MeshError
from alpa_pass.mesh import LogicalMesh


def resolve_mesh(mesh, saved_mesh: LogicalMesh | None = None):
    """The LogicalMesh to plan for, or for ``"auto"`` the tuple of candidate meshes.

    ``mesh``: a LogicalMesh (as given), ``"auto"`` (every logical shape of the device count), a
    shape tuple over all devices (its product must be the device count: MeshError otherwise), or
    ``None``: ``saved_mesh`` (a saved plan's mesh) when given, else all devices as ``1 x N``.
    """
    if isinstance(mesh, LogicalMesh):
        return mesh
    n = len(jax.devices())
    if mesh == "auto":
        return candidate_meshes(n)
    if mesh is None:
        return saved_mesh if saved_mesh is not None else LogicalMesh(shape=(1, n))
    shape = tuple(int(s) for s in mesh)
    if math.prod(shape) != n:
        raise MeshError(f"mesh shape {'x'.join(map(str, shape))} has {math.prod(shape)} positions but there "
                        f"are {n} devices; give a shape whose product is {n}")
    return LogicalMesh(shape=shape)
