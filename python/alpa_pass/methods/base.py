"""The base of the parallel methods ``parallelize`` accepts: each builds its own executable."""
from __future__ import annotations


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


def take_alpa_names(method, option_alias: str) -> None:
    """Fold Alpa's keyword names of a method's fields into ours: ``devices=`` into ``mesh`` and
    ``option_alias`` (``auto_sharding_option=`` / ``default_auto_sharding_option=``) into
    ``option``; afterwards both names read the same value. TypeError when both names are given
    different values."""
    from alpa_pass.options import DEFAULT_OPTION
    from alpa_pass.physical_mesh import as_logical_mesh

    name = type(method).__name__
    if method.devices is not None:
        mesh = as_logical_mesh(method.devices, name)
        if method.mesh is not None and method.mesh != mesh:
            raise TypeError(f"{name}: give mesh= or devices= (Alpa's name of it), not both")
        object.__setattr__(method, "mesh", mesh)
    object.__setattr__(method, "devices", method.mesh)
    alias = getattr(method, option_alias)
    if alias is not None:
        if method.option is not DEFAULT_OPTION and method.option != alias:
            raise TypeError(f"{name}: give option= or {option_alias}= (Alpa's name of it), not both")
        object.__setattr__(method, "option", alias)
    object.__setattr__(method, option_alias, method.option)
