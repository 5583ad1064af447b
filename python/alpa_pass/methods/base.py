"""The base of the parallel methods ``parallelize`` accepts: each builds its own executable."""
from __future__ import annotations

from alpa_pass._aliases import keyword_aliases


class ParallelMethod:
    """A way to run a function on many devices.

    Subclasses implement :meth:`build_executable`; those whose result is one intra-op plan
    (``ShardParallel`` and the presets) also implement :meth:`plan`.
    """

    def build_executable(self, fn, args, donate_argnums):
        """Plan and compile ``fn(*args)`` (``args``: the dynamic arguments, a tuple; arrays or
        ``jax.ShapeDtypeStruct``s) and return a callable executable with a ``plan``.
        ``donate_argnums``: positions in ``args`` whose buffers the executable may reuse."""
        raise NotImplementedError(f"{type(self).__name__} does not build executables")

    def plan_for(self, fn, args, donate_argnums):
        """Plan only (nothing compiled) and return the Plan."""
        raise TypeError(f"{type(self).__name__} has no single intra-op plan to return; "
                        f"use get_executable(*args).plan")

    @property
    def as_option(self):
        """Alpa's name of the method's planner options (``option``)."""
        return self.option


def _mesh_of(devices, name):
    from alpa_pass.physical_mesh import as_logical_mesh

    return as_logical_mesh(devices, name)


def alpa_names(option_alias: str):
    """Class decorator (above ``@dataclass``): the method also takes Alpa's keyword names
    ``devices=`` (for ``mesh``: a LogicalMesh, a ``PhysicalDeviceMesh`` or a list of devices) and
    ``option_alias=`` (``auto_sharding_option=`` / ``default_auto_sharding_option=``, for
    ``option``) and reads them back (``_aliases.keyword_aliases``)."""
    return keyword_aliases(devices=("mesh", _mesh_of), **{option_alias: ("option", None)})
