"""The logical device mesh a plan is made for."""
from __future__ import annotations

import dataclasses
import math
import operator
from typing import Sequence

import numpy as np

from alpa_pass import _core
from alpa_pass.errors import MeshError

_DEFAULT_AXIS_NAMES = ("x", "y", "z", "w")


@dataclasses.dataclass(frozen=True)
class LogicalMesh:
    """An N-D logical view of devices with an alpha-beta communication cost per axis.

    Args:
      shape: devices along each axis, e.g. ``(2, 4)`` (an int ``n`` means ``(n,)``); without
        ``devices`` the product must equal ``len(jax.devices())`` (MeshError when compiled).
      alpha: latency of one collective on each axis (default 1.0 per axis).
      beta: cost per byte on each axis (default 1.0 per axis). A smaller beta means a faster axis.
      axis_names: names used in ``PartitionSpec``s (default ``"x", "y", "z", "w"``).
      devices: the distinct devices, in mesh order, ``prod(shape)`` of them (e.g.
        ``jax.devices()[:4]`` for a mesh over part of the machine); default all of ``jax.devices()``.
    """

    shape: tuple[int, ...]
    alpha: tuple[float, ...] | None = None
    beta: tuple[float, ...] | None = None
    axis_names: tuple[str, ...] | None = None
    devices: tuple | None = None

    def __post_init__(self):
        shape = _as_shape(self.shape)
        n = len(shape)
        alpha = tuple(float(a) for a in (self.alpha if self.alpha is not None else (1.0,) * n))
        beta = tuple(float(b) for b in (self.beta if self.beta is not None else (1.0,) * n))
        for name, vals in (("alpha", alpha), ("beta", beta)):
            if len(vals) != n:
                raise MeshError(f"LogicalMesh {name} has {len(vals)} entries but the mesh has {n} axes "
                                f"(shape {shape}); give one {name} per axis")
            if any(not math.isfinite(v) or v < 0 for v in vals):
                raise MeshError(f"LogicalMesh {name}={vals} must be finite and >= 0")
        names = self.axis_names
        if names is None:
            names = _DEFAULT_AXIS_NAMES[:n] if n <= len(_DEFAULT_AXIS_NAMES) else tuple(f"a{i}" for i in range(n))
        names = tuple(str(a) for a in names)
        if len(names) != n or len(set(names)) != n:
            raise MeshError(f"LogicalMesh axis_names {names} must be {n} distinct names")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "alpha", alpha)
        object.__setattr__(self, "beta", beta)
        object.__setattr__(self, "axis_names", names)
        if self.devices is not None:
            devices = tuple(self.devices)
            repeated = sorted({str(d) for d in devices if devices.count(d) > 1})
            if repeated:
                raise MeshError(f"LogicalMesh devices= names {', '.join(repeated)} more than once; give each "
                                f"device once (e.g. devices=jax.devices()[:{math.prod(shape)}])")
            object.__setattr__(self, "devices", devices)

    @property
    def num_devices(self) -> int:
        return int(np.prod(self.shape))

    def jax_mesh(self):
        """The ``jax.sharding.Mesh`` over this mesh's devices (checks the device count)."""
        import jax
        from jax.sharding import Mesh

        devices = list(self.devices) if self.devices is not None else list(jax.devices())
        if self.devices is None and len(devices) < self.num_devices:
            raise MeshError(f"LogicalMesh shape {self.shape} needs {self.num_devices} devices but only "
                            f"{len(devices)} are available ({devices[0].platform}); use a smaller shape "
                            f"or, on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N")
        if self.devices is None and len(devices) != self.num_devices:
            raise MeshError(f"LogicalMesh shape {self.shape} has {self.num_devices} positions but there are "
                            f"{len(devices)} devices; give a shape whose product is {len(devices)}, or "
                            f"devices=jax.devices()[:{self.num_devices}] to use only some of them")
        if self.devices is not None and len(devices) != self.num_devices:
            raise MeshError(f"LogicalMesh shape {self.shape} has {self.num_devices} positions but "
                            f"{len(devices)} devices were given")
        return Mesh(np.array(devices, dtype=object).reshape(self.shape), self.axis_names)

    def to_core(self, axis_order: Sequence[str] = ()):
        """The C++ core's Mesh (``axis_order``: axis names, most major first; empty: mesh order)."""
        return _core.Mesh(shape=list(self.shape), alpha=list(self.alpha), beta=list(self.beta),
                          axis_order=self.axis_indices(axis_order))

    def axis_indices(self, order: Sequence[str] = ()) -> list[int]:
        """The mesh axes of ``order`` (axis names, most major first) as indices; empty stays empty."""
        if order and sorted(order) != sorted(self.axis_names):
            raise MeshError(f"axis order {tuple(order)} is not a permutation of the mesh axes {self.axis_names}")
        return [self.axis_names.index(a) for a in order]

    def spec_to_partition_spec(self, spec: Sequence[int], rank: int, order: Sequence[str] = ()):
        """Core spec (tensor dim per mesh axis, -1 = none) -> ``jax.sharding.PartitionSpec``
        (a dim split over several axes lists them in ``order``, see :meth:`dim_axes`)."""
        from jax.sharding import PartitionSpec

        return PartitionSpec(*[_entry(axes) for axes in self.dim_axes(spec, rank, order)])

    def dim_axes(self, spec: Sequence[int], rank: int, order: Sequence[str] = ()) -> list[tuple[str, ...]]:
        """Per tensor dim, the mesh axis names splitting it (major to minor).

        A core spec says which axes split a dim, not in which order; ``order`` (axis names, most
        major first: a plan's ``axis_order``) decides it, mesh order when empty."""
        ranked = [self.axis_names.index(a) for a in order] if order else range(len(self.axis_names))
        if order and sorted(ranked) != list(range(len(self.axis_names))):
            raise MeshError(f"axis order {tuple(order)} is not a permutation of the mesh axes {self.axis_names}")
        out = [[] for _ in range(rank)]
        for axis in ranked:
            dim = spec[axis] if axis < len(spec) else -1
            if dim >= 0:
                out[dim].append(self.axis_names[axis])
        return [tuple(a) for a in out]


def _as_shape(shape) -> tuple[int, ...]:
    """``shape`` as a non-empty tuple of positive ints (an int ``n`` is ``(n,)``), else MeshError."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        out = tuple(operator.index(s) for s in shape)
    except TypeError:
        out = ()
    if not out or any(s < 1 for s in out):
        raise MeshError(f"LogicalMesh shape must be a positive int or a non-empty tuple of positive ints "
                        f"(devices per axis, e.g. (2, 4)), got {shape!r}")
    return out


def _entry(axes: tuple[str, ...]):
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else axes
