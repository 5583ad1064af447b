"""``init`` / ``shutdown``: Alpa's cluster calls, kept so that a script written for Alpa runs.

Alpa starts workers on a Ray cluster (``alpa.init(cluster="ray")``). alpa_pass has no Ray: each
process plans over the devices jax gives it, and several hosts are several processes under
``mpirun`` (``python -m alpa_pass.launch``, README "Several processes"). ``init`` checks that what
the script asks for is what this run has, and says how to get it where not; it starts nothing.
"""
from __future__ import annotations

import logging

import jax

from alpa_pass.errors import OptionError

log = logging.getLogger("alpa_pass")

CLUSTERS = ("local", "ray")


def init(cluster: str = "ray", cluster_address=None, num_nodes: int | None = None,
         num_devices_per_node: int | None = None, namespace=None, scheduler_address=None) -> None:
    """Alpa's ``alpa.init``: check the run matches; start nothing (no Ray).

    ``cluster``: "ray" (Alpa's default) or "local"; either way the devices are this run's own.
    ``num_nodes``: hosts the script expects, this run's process count (one process per host under
    ``mpirun``); ``num_devices_per_node``: devices per host, this process's local device count.
    ``cluster_address``, ``namespace``, ``scheduler_address`` (Ray's) are accepted and unused.
    Raises OptionError where the run does not match, saying how to launch one that does.
    """
    if cluster not in CLUSTERS:
        raise OptionError(f"alpa_pass.init(cluster={cluster!r}): cluster is one of {CLUSTERS}; alpa_pass "
                          f"plans over the devices jax sees in this process (several hosts: mpirun -np N "
                          f"python -m alpa_pass.launch script.py)")
    processes, local = jax.process_count(), jax.local_device_count()
    if num_nodes is not None and num_nodes != processes:
        raise OptionError(f"alpa_pass.init(num_nodes={num_nodes}): this run has {processes} process(es); "
                          f"alpa_pass runs one process per host without Ray: launch it as mpirun -np "
                          f"{num_nodes} python -m alpa_pass.launch script.py")
    if num_devices_per_node is not None and num_devices_per_node != local:
        raise OptionError(f"alpa_pass.init(num_devices_per_node={num_devices_per_node}): this process has "
                          f"{local} local devices and plans over all of them; to use fewer, give the method "
                          f"a mesh of the devices to use, e.g. ShardParallel(mesh=LogicalMesh((1, "
                          f"{num_devices_per_node}), devices=jax.devices()[:{num_devices_per_node}])), or "
                          f"hide the others (CUDA_VISIBLE_DEVICES)")
    if cluster == "ray":
        log.info("alpa_pass: init(cluster='ray'): alpa_pass runs without Ray; planning over this run's "
                 "%d device(s) in %d process(es)", jax.device_count(), processes)


def shutdown() -> None:
    """Alpa's ``alpa.shutdown``: nothing to stop (no Ray workers); compiled steps stay usable."""


class DeviceCluster:
    """Alpa's ``DeviceCluster``: here this run's devices (every process's under ``mpirun``)."""

    def __init__(self, *_ray_args, **_ray_kwargs):
        from alpa_pass.physical_mesh import PhysicalDeviceMesh

        self._mesh = PhysicalDeviceMesh()

    @property
    def num_devices(self) -> int:
        return self._mesh.num_devices

    def get_physical_mesh(self, host_ids=None, num_devices_per_host=None):
        """All of this run's devices as one physical mesh (Alpa's arguments pick part of a Ray
        cluster: a different choice raises OptionError saying how to pick devices here)."""
        if host_ids is not None or num_devices_per_host not in (None, self._mesh.num_devices_per_host):
            raise OptionError("DeviceCluster.get_physical_mesh: a part of the cluster is picked by giving "
                              "the devices, e.g. PhysicalDeviceMesh(jax.devices()[:4])")
        return self._mesh

    get_virtual_physical_mesh = get_physical_mesh


def get_global_cluster() -> DeviceCluster:
    """Alpa's ``get_global_cluster``: this run's devices."""
    return DeviceCluster()


def get_global_physical_mesh(create_if_not_exist: bool = True):
    """Alpa's ``get_global_physical_mesh``: all of this run's devices (there is always one)."""
    return DeviceCluster().get_physical_mesh()


get_global_virtual_physical_mesh = get_global_physical_mesh


def get_global_num_devices() -> int:
    """Alpa's ``get_global_num_devices``: the devices of this run, every process's."""
    return jax.device_count()


def prefetch(tree) -> None:
    """Alpa's ``alpa.prefetch``: start copying the arrays of ``tree`` to the host, so that a later
    ``np.asarray`` (``alpa_pass.util.map_to_nparray``) waits less. Leaves that are not jax
    arrays are left alone."""
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array) and leaf.is_fully_addressable:
            leaf.copy_to_host_async()
