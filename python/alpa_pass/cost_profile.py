"""A measured cost profile of a cluster: its data, JSON, alpha-beta fits and the planner's view.

``alpa-pass profile`` (``alpa_pass.tools.profile``) measures collectives per mesh axis, matmul
throughput and memory bandwidth on the devices it runs on and writes a :class:`ClusterProfile`
as JSON. ``AutoShardingOption(profile=PATH | dict | "auto")`` plans with it: each mesh axis gets
the measured alpha (seconds per collective) and beta (seconds per byte) and ops cost their FLOPs
over the measured matmul throughput, so the ILP's objective is in seconds. Nothing here measures:
a profile is a planning input like the program and the mesh.

A mesh axis is identified by where its devices sit in the device order of the cluster
(``jax.devices()``): ``size`` devices spaced ``stride`` apart. In a row-major mesh of shape
``(s0, s1, ..., sk)`` axis ``i`` has size ``s_i`` and stride ``s_{i+1} * ... * s_k``; e.g. on 8
devices the mesh (2, 4) has axes (size 2, stride 4) and (size 4, stride 1).

The per-axis alpha/beta the core receives is one least-squares fit over the measured all-reduce,
all-gather, reduce-scatter and all-to-all times, each against the core's own byte factor for its
kind (``cpp/include/alpa/mesh.h``: all-reduce 2(n-1)/n B, all-gather and reduce-scatter
(n-1)/n B, all-to-all (n-1)/(2n) B), so that the core's formulas reproduce the measurements as
closely as one (alpha, beta) pair can. The per-kind fits are kept in the JSON too.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re

import numpy as np

from alpa_pass.errors import OptionError

FORMAT = "alpa_pass.profile"
FORMAT_VERSION = 1
KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
CORE_KINDS = KINDS[:4]  # the kinds the core's cost model has (no collective-permute term)
DEFAULT_CACHE_DIR = "~/.cache/alpa_pass/profiles"


def byte_factor(kind: str, n: int) -> float:
    """The core's bandwidth term of ``kind`` on an axis of ``n`` devices, per byte of the full
    buffer (``cpp/include/alpa/mesh.h``); collective-permute sends the buffer once."""
    if n <= 1:
        return 0.0
    return {"all-reduce": 2.0 * (n - 1) / n, "all-gather": (n - 1) / n, "reduce-scatter": (n - 1) / n,
            "all-to-all": (n - 1) / (2.0 * n), "collective-permute": 1.0}[kind]


def fit_alpha_beta(x, t) -> tuple[float, float]:
    """(alpha, beta) >= 0 of ``t ~ alpha + beta * x``, fitted on relative errors.

    ``x``: bytes (already multiplied by the kind's byte factor), ``t``: seconds, one entry per
    measurement; samples with ``t <= 0`` (differences lost in timing noise) are left out. The
    residuals are log(predicted / measured), so small (latency-bound) and large (bandwidth-bound)
    sizes count alike and a timing too low weighs like one too high, under a robust soft-L1 loss
    (scipy's ``least_squares``, started from the non-negative linear fit), so one disturbed
    timing on a busy machine does not drag the fit; noise-free samples are fitted exactly.
    """
    from scipy.optimize import least_squares, nnls

    x, t = np.asarray(x, dtype=np.float64), np.asarray(t, dtype=np.float64)
    if x.shape != t.shape or x.ndim != 1:
        raise ValueError(f"fit_alpha_beta needs two equal-length 1-D arrays, got shapes {x.shape}, {t.shape}")
    keep = np.isfinite(x) & np.isfinite(t) & (t > 0) & (x >= 0)
    x, t = x[keep], t[keep]
    if len(x) < 2 or np.ptp(x) == 0:
        raise ValueError(f"fit_alpha_beta needs >= 2 timings > 0 at different sizes, got {len(x)}")
    ts, xs = float(np.median(t)), float(np.max(x))  # scale both unknowns to ~1
    a = np.stack([np.full_like(x, ts), x / xs * ts], axis=1) / t[:, None]
    start, _ = nnls(a, np.ones_like(t))
    start = np.maximum(start, 1e-6 * max(start.max(), 1e-12))  # strictly inside the bounds
    fit = least_squares(lambda p: np.log(np.maximum(a @ p, 1e-300)), start, bounds=(0.0, np.inf),
                        loss="soft_l1", f_scale=0.1, x_scale="jac", xtol=1e-15, ftol=1e-15, gtol=1e-15)
    p = fit.x
    return float(p[0] * ts), float(p[1] * ts / xs)


def cluster_key(platform: str, device_kind: str, num_devices: int, devices_per_process) -> str:
    """File-name-safe key of a cluster: platform, device kind, device count and process layout,
    e.g. ``cpu-cpu-8dev-1x8`` (one process of 8 devices) or ``gpu-nvidia-h200-16dev-2x8``."""
    per = list(devices_per_process)
    layout = f"{len(per)}x{per[0]}" if len(set(per)) == 1 else "-".join(map(str, per))
    slug = re.sub(r"[^a-z0-9]+", "-", f"{platform}-{device_kind}".lower()).strip("-")
    return f"{slug}-{int(num_devices)}dev-{layout}"


def current_cluster() -> dict:
    """platform, device_kind, num_devices, devices_per_process (in process order) of this job."""
    import jax

    devices = jax.devices()
    per = [0] * (max(d.process_index for d in devices) + 1)
    for d in devices:
        per[d.process_index] += 1
    return {"platform": devices[0].platform, "device_kind": devices[0].device_kind,
            "num_devices": len(devices), "devices_per_process": per}


def axes_of(num_devices: int) -> list[tuple[int, int]]:
    """Every (size, stride) of a mesh axis of size > 1 over ``num_devices`` devices in row-major
    order: ``size * stride`` divides ``num_devices``."""
    return [(n, s) for s in range(1, num_devices + 1) if num_devices % s == 0
            for n in range(2, num_devices // s + 1) if (num_devices // s) % n == 0]


def mesh_axes(shape) -> list[tuple[int, int]]:
    """(size, stride) of each axis of a row-major mesh of ``shape``."""
    return [(int(n), int(math.prod(shape[i + 1:]))) for i, n in enumerate(shape)]


@dataclasses.dataclass(frozen=True, eq=False)
class ClusterProfile:
    """A cluster's measured costs (see the module doc). Build with :meth:`from_dict` /
    :func:`load`; ``str()`` and :attr:`digest` name its content (plan fingerprints use them)."""

    data: dict

    @classmethod
    def from_dict(cls, data: dict, where: str = "profile") -> "ClusterProfile":
        """A validated profile (OptionError saying what is missing or wrong)."""
        data = json.loads(json.dumps(data))  # a private, JSON-only copy
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise OptionError(f"{where} is not an alpa_pass profile (no \"format\": \"{FORMAT}\"); make one "
                              f"with `alpa-pass profile`")
        if data.get("format_version") != FORMAT_VERSION:
            raise OptionError(f"{where} has format_version {data.get('format_version')!r}; this alpa_pass reads "
                              f"{FORMAT_VERSION}: run `alpa-pass profile` again")
        try:
            axes = data["axes"]
            for a in axes:
                for name in ("size", "stride"):
                    if int(a[name]) < 1:
                        raise ValueError(f"axis {name} {a[name]} < 1")
                for name in ("alpha", "beta"):
                    if not (math.isfinite(float(a[name])) and float(a[name]) >= 0):
                        raise ValueError(f"axis {name} {a[name]} is not a finite number >= 0")
            flops = float(data["compute"]["matmul_flops_per_s"]["float32"])
            if not (math.isfinite(flops) and flops > 0):
                raise ValueError(f"matmul_flops_per_s.float32 {flops} is not > 0")
            int(data["cluster"]["num_devices"])
        except (KeyError, TypeError, ValueError) as e:
            raise OptionError(f"{where} is malformed ({type(e).__name__}: {e}); it needs \"axes\" (size, stride, "
                              f"alpha, beta each), \"compute\".\"matmul_flops_per_s\".\"float32\" and "
                              f"\"cluster\".\"num_devices\": run `alpa-pass profile` again") from None
        return cls(data)

    @property
    def key(self) -> str:
        return self.data.get("key", "")

    @property
    def digest(self) -> str:
        """sha256 of the canonical JSON of the profile's content."""
        return hashlib.sha256(json.dumps(self.data, sort_keys=True).encode()).hexdigest()

    def __str__(self):  # what plan options and cache keys record
        return f"profile {self.key} sha256:{self.digest[:16]}"

    __repr__ = __str__

    def __eq__(self, other):
        return isinstance(other, ClusterProfile) and self.digest == other.digest

    def __hash__(self):
        return hash(self.digest)

    @property
    def seconds_per_flop(self) -> float:
        """The planner's compute cost: 1 / measured float32 matmul FLOP/s of one device (all
        devices busy at once)."""
        return 1.0 / float(self.data["compute"]["matmul_flops_per_s"]["float32"])

    @property
    def seconds_per_flop_half(self) -> float:
        """The compute cost of a dot or convolution of 16-bit floats: 1 / measured bfloat16 matmul
        FLOP/s (0.0, the float32 rate, when the profile has none)."""
        flops = float(self.data["compute"]["matmul_flops_per_s"].get("bfloat16") or 0.0)
        return 1.0 / flops if math.isfinite(flops) and flops > 0 else 0.0

    @property
    def seconds_per_byte(self) -> float:
        """1 / the measured memory bandwidth of one device (all devices busy): what a byte an op
        reads or writes costs (``_core.CoreOptions.compute_cost_per_byte``); 0.0 when not measured."""
        bandwidth = float(self.data["compute"].get("memory_bytes_per_s") or 0.0)
        return 1.0 / bandwidth if math.isfinite(bandwidth) and bandwidth > 0 else 0.0

    @property
    def reference_beta(self) -> float:
        """Median per-axis beta (seconds per byte): the profile's unit of one byte moved, which
        scales the memory tie-breaker so that it weighs as little as with the default beta 1. A
        profile of one device has no axes: there a byte moved through the device's memory
        (1 / measured memory bandwidth) is the unit (a 1.0 s/byte fallback made the tie-breaker
        the whole objective: GPT 1.3B on one H200 "cost" 15.9 s for a 0.2 s step)."""
        betas = [float(a["beta"]) for a in self.data["axes"]]
        if betas:
            return float(np.median(betas))
        return self.seconds_per_byte or 1.0

    def axis_cost(self, size: int, stride: int) -> tuple[float, float]:
        """(alpha, beta) of a mesh axis of ``size`` devices spaced ``stride`` apart: the measured
        axis, else the measured axis of the same size with the nearest stride (OptionError when no
        axis of that size was measured)."""
        if size <= 1:
            return 0.0, 0.0
        same = [a for a in self.data["axes"] if int(a["size"]) == size]
        if not same:
            sizes = sorted({int(a["size"]) for a in self.data["axes"]})
            raise OptionError(f"profile {self.key} measured mesh axes of sizes {sizes}, not {size}; profile the "
                              f"devices this mesh uses (`alpa-pass profile`) or plan without profile=")
        best = min(same, key=lambda a: (abs(math.log(int(a["stride"]) / stride)), int(a["stride"])))
        return float(best["alpha"]), float(best["beta"])

    def mesh_costs(self, shape) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(alpha per axis, beta per axis) of a row-major mesh of ``shape``."""
        costs = [self.axis_cost(n, s) for n, s in mesh_axes(tuple(shape))]
        return tuple(a for a, _ in costs), tuple(b for _, b in costs)

    def group_costs(self, shape) -> list[tuple[list[int], float, float]]:
        """(axes, alpha, beta) of every set of two or more axes of a row-major mesh of ``shape``
        whose devices form one measured group: consecutive axes (axes of one device between them
        do not count) span ``size`` = the product of their sizes, ``stride`` apart = the product of
        the sizes after them, e.g. both axes of 2x4 = all 8 devices (8, stride 1). XLA emits a
        collective over such axes as one over that group, which the profile timed as a whole; other
        sets keep the core's rule (the largest per-axis alpha and beta)."""
        used = [i for i, n in enumerate(shape) if int(n) > 1]
        strides = [s for _, s in mesh_axes(tuple(shape))]
        measured = {(int(a["size"]), int(a["stride"])): a for a in self.data["axes"]}
        out = []
        for lo in range(len(used)):
            for hi in range(lo + 2, len(used) + 1):
                axes = used[lo:hi]
                size = math.prod(int(shape[i]) for i in axes)
                entry = measured.get((size, strides[axes[-1]]))
                if entry is not None:
                    out.append((axes, float(entry["alpha"]), float(entry["beta"])))
        return out

    def core_mesh(self, mesh, axis_order=()):
        """The C++ core's Mesh of LogicalMesh ``mesh`` with this profile's alpha/beta per axis and
        per measured group of axes (:meth:`group_costs`); ``axis_order`` as ``LogicalMesh.to_core``."""
        from alpa_pass import _core

        alpha, beta = self.mesh_costs(mesh.shape)
        return _core.Mesh(shape=list(mesh.shape), alpha=list(alpha), beta=list(beta),
                          axes_costs=self.group_costs(tuple(mesh.shape)), axis_order=mesh.axis_indices(axis_order))

    def to_json(self) -> str:
        return json.dumps(self.data, indent=1, sort_keys=True) + "\n"


def load(path) -> ClusterProfile:
    """The profile in JSON file ``path`` (OptionError when missing, unreadable or malformed)."""
    path = os.path.expanduser(os.fspath(path))
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise OptionError(f"no profile file {path}; make one with `alpa-pass profile --out {path}`") from None
    except (OSError, ValueError) as e:
        raise OptionError(f"cannot read profile {path} ({e}); make it again with `alpa-pass profile`") from None
    return ClusterProfile.from_dict(data, where=f"profile {path}")


def cache_path(key: str, cache_dir: str | None = None) -> str:
    """Where the cached profile of cluster ``key`` lives (``~/.cache/alpa_pass/profiles/<key>.json``
    by default, or under ``$ALPA_PASS_PROFILE_DIR``)."""
    base = cache_dir or os.environ.get("ALPA_PASS_PROFILE_DIR") or DEFAULT_CACHE_DIR
    return os.path.join(os.path.expanduser(base), f"{key}.json")


def normalize(value):
    """An ``AutoShardingOption.profile`` value as stored: None, "auto" or a ClusterProfile (a
    path is read now; a dict is validated)."""
    if value is None or isinstance(value, ClusterProfile):
        return value
    if isinstance(value, str) and value == "auto":
        return value
    if isinstance(value, (str, os.PathLike)):
        return load(value)
    if isinstance(value, dict):
        return ClusterProfile.from_dict(value)
    raise OptionError(f"AutoShardingOption.profile must be None, 'auto', a path to a profile JSON or its dict, "
                      f"got {type(value).__name__}")


def resolve(value) -> ClusterProfile | None:
    """The profile to plan with: ``value`` itself, or for "auto" (the default) the cached profile of
    the current cluster (:func:`cache_path`), None when there is none (plans use the default unit
    costs; said once per path at INFO level)."""
    if value != "auto":
        return value
    path = cache_path(cluster_key(**current_cluster()))
    if not os.path.exists(path):
        if path not in _UNCACHED:
            _UNCACHED.add(path)
            import logging

            logging.getLogger("alpa_pass").info(
                "alpa_pass: no cached profile of this cluster at %s; planning with unit costs "
                "(`alpa-pass profile` measures one, and plans then cost seconds)", path)
        return None
    return load(path)


_UNCACHED: set[str] = set()  # cache paths already reported missing
