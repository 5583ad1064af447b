"""Check, with MPI, that every rank can reach the coordinator address before JAX tries to.

``jax.distributed.initialize`` does not raise when the coordinator cannot be reached: after its
timeout the process is terminated from C++ with "DEADLINE_EXCEEDED: RegisterTask". So the
launcher first has rank 0 listen on the coordinator port and every rank connect to it; any
failure becomes a LaunchError on every rank that names the ranks, their hosts and the reason.
"""
from __future__ import annotations

import socket

from alpa_pass.errors import LaunchError


def check_coordinator_reachable(comm, address: str, timeout_s: float) -> None:
    """A collective over ``comm``: raise LaunchError on every rank unless rank 0 can listen on
    ``address``'s port and every rank can open a TCP connection to ``address`` in ``timeout_s``."""
    host, port = split_address(address)
    listener, bind_error = (_listen(port) if comm.Get_rank() == 0 else (None, None))
    bind_error = comm.bcast(bind_error, root=0)
    if bind_error is not None:
        raise LaunchError(f"rank 0 cannot listen on port {port} for the JAX coordinator ({bind_error}); "
                          f"pick a free port with --coordinator HOST:PORT")
    failure = _try_connect(host.strip("[]"), port, timeout_s)
    failures = comm.allgather((comm.Get_rank(), socket.gethostname(), failure))  # all have tried
    if listener is not None:
        listener.close()
    bad = [(r, h, f) for r, h, f in failures if f is not None]
    if bad:
        lines = "; ".join(f"rank {r} on {h}: {f}" for r, h, f in bad)
        raise LaunchError(f"ranks {[r for r, _, _ in bad]} cannot reach the JAX coordinator at {address} "
                          f"(it runs on rank 0, host {failures[0][1]}): {lines}. Give an address of rank "
                          f"0's host that every host can reach with --coordinator HOST:PORT, and check "
                          f"firewalls")


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (IPv6 as ``"[::1]:port"``) -> (host, port); LaunchError if malformed."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise LaunchError(f"coordinator address {address!r} must be HOST:PORT (e.g. node0:29500 or "
                          f"10.0.0.1:29500), with a port in 1..65535")
    return host, int(port)


def _listen(port: int):
    """(listening socket, None) or (None, reason)."""
    s = socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if s.family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind(("", port))
        s.listen(1024)
    except OSError as e:
        s.close()
        return None, str(e)
    return s, None


def _try_connect(host: str, port: int, timeout_s: float) -> str | None:
    """None if a TCP connection to host:port opens within ``timeout_s``, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except socket.gaierror as e:
        return f"host name {host!r} does not resolve ({e.strerror})"
    except TimeoutError:
        return f"no answer within {timeout_s:g} s"
    except OSError as e:
        return e.strerror or str(e)
