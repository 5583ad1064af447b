"""``python -m alpa_pass.launch [flags] script.py [args]``: join the job, run the script, and make
any rank's failure end the whole job.

A rank whose script raises (or calls ``sys.exit`` with a non-zero code) prints its traceback and
calls ``MPI_Abort``: mpirun then kills every other rank at once. Without that, the others would
wait in their next collective, and the failed rank in JAX's exit barrier, for minutes. A rank
that dies outright (SIGKILL, segfault) is seen by mpirun the same way; under launchers that do not
watch their processes, JAX's heartbeat (``--heartbeat-timeout``) ends the others.
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback

from alpa_pass.errors import LaunchError
from alpa_pass.launch.distributed import LOCAL_DEVICES, LaunchOptions, describe, initialize, mpi_module


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of :class:`LaunchOptions` (shared by ``python -m alpa_pass.launch`` and
    ``alpa-pass run``)."""
    d = LaunchOptions()
    parser.add_argument("--coordinator", metavar="HOST:PORT", default=None,
                        help="JAX coordinator address (default: rank 0's host, a free port)")
    parser.add_argument("--cpu-devices-per-process", type=int, metavar="K", default=None,
                        help="run on CPU with K simulated devices per process (testing)")
    parser.add_argument("--local-devices", choices=LOCAL_DEVICES, default=d.local_devices,
                        help="GPUs per process: all, one (the local rank's), auto (default)")
    parser.add_argument("--init-timeout", type=int, metavar="S", default=d.init_timeout_s,
                        help=f"seconds to wait for all ranks at start (default {d.init_timeout_s})")
    parser.add_argument("--heartbeat-timeout", type=int, metavar="S", default=d.heartbeat_timeout_s,
                        help=f"seconds without heartbeat before a rank counts as dead "
                             f"(default {d.heartbeat_timeout_s})")
    parser.add_argument("--shutdown-timeout", type=int, metavar="S", default=d.shutdown_timeout_s,
                        help=f"seconds a finished rank waits for the others at exit "
                             f"(default {d.shutdown_timeout_s})")


def options_from_args(ns: argparse.Namespace) -> LaunchOptions:
    return LaunchOptions(coordinator=ns.coordinator, cpu_devices_per_process=ns.cpu_devices_per_process,
                         local_devices=ns.local_devices, init_timeout_s=ns.init_timeout,
                         heartbeat_timeout_s=ns.heartbeat_timeout, shutdown_timeout_s=ns.shutdown_timeout)


def launch_flags(options: LaunchOptions) -> list[str]:
    """Command-line flags of ``python -m alpa_pass.launch`` that reproduce ``options``."""
    flags = ["--local-devices", options.local_devices, "--init-timeout", str(options.init_timeout_s),
             "--heartbeat-timeout", str(options.heartbeat_timeout_s),
             "--shutdown-timeout", str(options.shutdown_timeout_s)]
    if options.coordinator is not None:
        flags += ["--coordinator", options.coordinator]
    if options.cpu_devices_per_process is not None:
        flags += ["--cpu-devices-per-process", str(options.cpu_devices_per_process)]
    return flags


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m alpa_pass.launch",
        description="Run SCRIPT on every MPI rank with jax.distributed initialised "
                    "(start it with mpirun -np N ..., or use `alpa-pass run`).")
    add_launch_arguments(p)
    p.add_argument("--quiet", action="store_true", help="do not print the one-line rank banner")
    p.add_argument("script", help="the Python script every rank runs")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    return p


def run_script(path: str, args: list[str]) -> None:
    """Run ``path`` as ``__main__`` with ``sys.argv = [path, *args]`` and its folder on sys.path."""
    if not os.path.isfile(path):
        raise LaunchError(f"script {path!r} does not exist")
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    runpy.run_path(path, run_name="__main__")


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m alpa_pass.launch``."""
    ns = parser().parse_args(argv)
    try:
        info = initialize(options_from_args(ns))
    except LaunchError as e:
        _fail(f"alpa_pass.launch: {e}", multi=_world_size() > 1)
    if not ns.quiet:
        print(describe(info), file=sys.stderr, flush=True)
    try:
        run_script(ns.script, ns.args)
    except SystemExit as e:
        if e.code not in (None, 0):
            _fail(f"alpa_pass.launch: rank {info.rank} exited with {e.code!r}", info.size > 1,
                  e.code if isinstance(e.code, int) else 1)
        raise
    except BaseException:  # noqa: BLE001 - any failure of the user's script must end all ranks
        traceback.print_exc()
        _fail(f"alpa_pass.launch: rank {info.rank} of {info.size} failed (traceback above); "
              f"aborting the job", info.size > 1)


def _world_size() -> int:
    try:
        return mpi_module().COMM_WORLD.Get_size()
    except LaunchError:
        return 1


def _fail(message: str, multi: bool, code: int = 1):
    """Print ``message``; end the whole MPI job (``multi``) or just this process, with ``code``."""
    print(message, file=sys.stderr, flush=True)
    sys.stdout.flush()
    if multi:
        mpi_module().COMM_WORLD.Abort(code)
    raise SystemExit(code)
