"""Stages: consecutive layer ranges, each on a submesh of the cluster mesh.

The cluster mesh is viewed as ``rows x cols`` (all axes but the last flattened into rows); a
submesh is ``(r, cols)`` or ``(1, c)`` with ``c`` dividing ``cols``; submeshes take the cluster's
devices in order, so they are disjoint.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from alpa_pass.errors import MeshError
from alpa_pass.mesh import LogicalMesh


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """One pipeline stage: layers ``[start, stop)`` on ``mesh`` (a LogicalMesh with its devices)."""

    start: int
    stop: int
    physical_shape: tuple
    mesh: LogicalMesh

    @property
    def layers(self) -> range:
        return range(self.start, self.stop)


def cluster_grid(cluster: LogicalMesh) -> tuple[int, int]:
    """``(rows, cols)``: the cluster seen as hosts x devices per host."""
    return int(np.prod(cluster.shape[:-1], dtype=np.int64)), int(cluster.shape[-1])


def cluster_devices(cluster: LogicalMesh) -> list:
    return list(cluster.jax_mesh().devices.flatten())


def submesh_shape(cluster: LogicalMesh, n: int) -> tuple[int, int]:
    """The physical submesh of ``n`` devices: ``(1, n)`` within a row, else ``(n / cols, cols)``."""
    rows, cols = cluster_grid(cluster)
    if n <= cols and cols % n == 0:
        return (1, n)
    if n % cols == 0 and n // cols <= rows:
        return (n // cols, cols)
    raise MeshError(f"{n} devices do not form a submesh of the {rows} x {cols} cluster mesh "
                    f"{cluster.shape}: use (1, c) with c dividing {cols}, or (r, {cols})")


def logical_mesh(cluster: LogicalMesh, physical: tuple, logical: tuple, devices: list) -> LogicalMesh:
    """A LogicalMesh of shape ``logical`` over ``devices``; axis 0 costs like the cluster's rows
    when the submesh spans rows, axis 1 like its columns."""
    if int(np.prod(logical)) != int(np.prod(physical)):
        raise MeshError(f"logical submesh {logical} has a different device count than physical {physical}")
    row = 0 if physical[0] > 1 and len(cluster.shape) > 1 else len(cluster.shape) - 1
    col = len(cluster.shape) - 1
    return LogicalMesh(shape=tuple(logical), alpha=(cluster.alpha[row], cluster.alpha[col]),
                       beta=(cluster.beta[row], cluster.beta[col]), devices=tuple(devices))


def carve(cluster: LogicalMesh, ranges, physicals, logicals=None) -> list[StageSpec]:
    """StageSpecs for layer ``ranges`` on submeshes ``physicals`` taken in device order."""
    devices = cluster_devices(cluster)
    need = sum(int(np.prod(p)) for p in physicals)
    if need > len(devices):
        raise MeshError(f"the stages need {need} devices ({list(physicals)}) but the cluster mesh "
                        f"{cluster.shape} has {len(devices)}")
    specs, at = [], 0
    for i, ((a, b), phys) in enumerate(zip(ranges, physicals)):
        n = int(np.prod(phys))
        if tuple(phys) != submesh_shape(cluster, n):
            raise MeshError(f"stage {i}: submesh {tuple(phys)} is not a submesh of the cluster mesh "
                            f"{cluster.shape}; use {submesh_shape(cluster, n)}")
        logical = tuple(logicals[i]) if logicals is not None else tuple(phys)
        specs.append(StageSpec(a, b, tuple(phys), logical_mesh(cluster, phys, logical, devices[at:at + n])))
        at += n
    return specs


def uniform_stages(num_layers: int, cluster: LogicalMesh, num_stages: int | None) -> list[StageSpec]:
    """``num_stages`` stages of ~equal layer counts on equal submeshes."""
    s = num_layers if num_stages is None else int(num_stages)
    n = cluster.num_devices
    if s > n:
        raise MeshError(f"{s} pipeline stages need at least {s} devices but the cluster mesh "
                        f"{cluster.shape} has {n}; use fewer stages or a larger mesh")
    if s > num_layers:
        raise MeshError(f"{s} pipeline stages need at least {s} layers but the loss has {num_layers}; "
                        f"add mark_pipeline_boundary() calls or use fewer stages")
    if n % s:
        raise MeshError(f"UniformStageOption(num_stages={s}) must divide the {n} devices of the cluster "
                        f"mesh {cluster.shape}")
    cuts = [round(i * num_layers / s) for i in range(s + 1)]
    phys = submesh_shape(cluster, n // s)
    return carve(cluster, list(zip(cuts[:-1], cuts[1:])), [phys] * s)


def manual_stages(num_layers: int, cluster: LogicalMesh, option) -> list[StageSpec]:
    """Stages from a ManualStageOption; the layer ids must be consecutive and cover every layer."""
    ids = option.forward_stage_layer_ids
    flat = [i for s in ids for i in s]
    if flat != list(range(num_layers)) or any(not s for s in ids):
        raise MeshError(f"ManualStageOption.forward_stage_layer_ids {ids} must split layers 0..{num_layers - 1} "
                        f"into non-empty consecutive groups, in order")
    if len(ids) > cluster.num_devices:
        raise MeshError(f"{len(ids)} pipeline stages need at least {len(ids)} devices but the cluster mesh "
                        f"{cluster.shape} has {cluster.num_devices}")
    ranges = [(s[0], s[-1] + 1) for s in ids]
    return carve(cluster, ranges, option.submesh_physical_shapes, option.submesh_logical_shapes)
