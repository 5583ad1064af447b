"""Alpa's physical meshes as views of jax's devices, so that a script written for Alpa runs.

In Alpa a ``PhysicalDeviceMesh`` is a set of Ray workers; a ``LogicalDeviceMesh`` (what the
planner uses) is a reshaped view of one with an alpha-beta cost per axis. Here the devices are
jax's (``jax.devices()``: every process's under ``mpirun``), a physical mesh is hosts (processes) x
devices per host, and ``get_logical_mesh`` returns an ``alpa_pass.LogicalMesh`` over its devices.
``as_logical_mesh`` turns what Alpa's methods accept as ``devices=`` into the mesh to plan for.
"""
from __future__ import annotations

from typing import Sequence

from alpa_pass.errors import MeshError
from alpa_pass.mesh import LogicalMesh


class PhysicalDeviceMesh:
    """Devices grouped by host: ``shape == (num_hosts, num_devices_per_host)``.

    Args:
      devices: the devices, in order (default ``jax.devices()``); every host must hold as many
        of them (MeshError otherwise).
    """

    def __init__(self, devices: Sequence | None = None):
        import jax

        devices = tuple(jax.devices() if devices is None else devices)
        if not devices:
            raise MeshError("PhysicalDeviceMesh needs at least one device")
        hosts = {}
        for d in devices:
            hosts.setdefault(d.process_index, []).append(d)
        counts = sorted({len(ds) for ds in hosts.values()})
        if len(counts) != 1:
            raise MeshError(f"PhysicalDeviceMesh: the hosts hold {counts} of the devices given; give every "
                            f"host the same number of devices")
        self.devices = devices
        self.num_hosts = len(hosts)
        self.num_devices_per_host = counts[0]
        self.host_ids = tuple(sorted(hosts))

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def shape(self) -> tuple[int, int]:
        return self.num_hosts, self.num_devices_per_host

    def get_logical_mesh(self, mesh_shape=None, mesh_alpha=None, mesh_beta=None, **_alpa_only) -> LogicalMesh:
        """A ``LogicalMesh`` of ``mesh_shape`` (default ``shape``) over these devices, with
        ``mesh_alpha`` / ``mesh_beta`` per axis (default 1). Alpa's other arguments (a topology,
        measured bandwidths) are for its profiler and are not used."""
        return LogicalMesh(tuple(self.shape if mesh_shape is None else mesh_shape), alpha=mesh_alpha,
                           beta=mesh_beta, devices=self.devices)

    def get_physical_mesh(self) -> "PhysicalDeviceMesh":
        """Alpa's ``VirtualPhysicalMesh.get_physical_mesh``: the mesh itself (nothing to launch)."""
        return self

    def shutdown(self) -> None:
        """Nothing to stop: the devices are this run's."""

    def __repr__(self):
        return (f"PhysicalDeviceMesh({self.num_hosts} host(s) x {self.num_devices_per_host} "
                f"{self.devices[0].platform} device(s))")


LocalPhysicalDeviceMesh = PhysicalDeviceMesh  # Alpa's name of a one-host mesh


def as_logical_mesh(devices, who: str) -> LogicalMesh | None:
    """The mesh to plan for from Alpa's ``devices=``: a LogicalMesh (as it is), a physical mesh
    (its default logical mesh, hosts x devices per host), a sequence of jax devices (1 x N over
    them) or None (None). TypeError for anything else, naming ``who``."""
    if devices is None or isinstance(devices, LogicalMesh):
        return devices
    if isinstance(devices, PhysicalDeviceMesh):
        return devices.get_logical_mesh()
    if isinstance(devices, (list, tuple)) and devices and all(hasattr(d, "process_index") for d in devices):
        return LogicalMesh((1, len(devices)), devices=tuple(devices))
    raise TypeError(f"{who}(devices=...) takes an alpa_pass.LogicalMesh, a PhysicalDeviceMesh "
                    f"(alpa_pass.get_global_physical_mesh()), a list of jax devices or None; "
                    f"got {type(devices).__name__}")
