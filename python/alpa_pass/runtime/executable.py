"""A planned, compiled step: call it with the same pytree structure it was planned for."""
from __future__ import annotations

import jax

from alpa_pass.plan.plan import Plan
from alpa_pass.runtime.multiprocess import place_global


class Executable:
    """One compiled SPMD executable plus its plan.

    Attributes:
      plan: the Plan it implements.
      input_shardings / output_shardings: flat lists of ``NamedSharding`` (argument / output leaves).
    """

    def __init__(self, plan: Plan, compiled, in_treedef, out_treedef):
        self.plan = plan
        self._compiled = compiled
        self._in_treedef = in_treedef
        self._out_treedef = out_treedef
        self.input_shardings = list(jax.tree.leaves(compiled.input_shardings[0]))
        self.output_shardings = list(jax.tree.leaves(compiled.output_shardings))

    @property
    def in_treedef(self):
        """The pytree structure of the argument tuple it was planned for."""
        return self._in_treedef

    @property
    def abstract_inputs(self) -> tuple:
        """The argument tuple as ``jax.ShapeDtypeStruct``s carrying the input shardings."""
        infos = jax.tree.leaves(self._compiled.args_info[0])
        return jax.tree.unflatten(self._in_treedef, [jax.ShapeDtypeStruct(i.shape, i.dtype, sharding=s)
                                                     for i, s in zip(infos, self.input_shardings)])

    def __call__(self, *args):
        return self.call_flat(*jax.tree.flatten(args))

    def call_flat(self, leaves, treedef):
        """``self(*jax.tree.unflatten(treedef, leaves))`` without flattening the arguments again."""
        return self._compiled(*jax.tree.unflatten(treedef, self.place_flat(leaves, treedef)))

    def place_flat(self, leaves, treedef) -> list:
        """The argument leaves placed in the layouts the step reads them in (those already there
        are returned as they are)."""
        if treedef != self._in_treedef:
            raise TypeError(f"this executable was planned for arguments {self._in_treedef}, got {treedef}; "
                            f"call the parallelized function (it plans each new structure) instead")
        return [self._place(x, s) for x, s in zip(leaves, self.input_shardings)]

    @staticmethod
    def _place(x, sharding):
        """``x`` with ``sharding``. A sharding over other processes' devices (multi-process runs)
        takes the same full host value on every process (see ``multiprocess.place_global``)."""
        if isinstance(x, jax.Array) and (x.sharding is sharding or x.sharding == sharding
                                         or x.sharding.is_equivalent_to(sharding, x.ndim)):
            return x  # (an equivalent placement, e.g. one device's array on a 1-device mesh, is taken as is)
        if not sharding.is_fully_addressable:
            return place_global(x, sharding)
        return jax.device_put(x, sharding)

    def hlo_text(self) -> str:
        """The SPMD-partitioned, optimized HLO of the compiled step (per-device shapes)."""
        return self._compiled.as_text()

    @property
    def auto_sharding_objective(self) -> float:
        """Alpa's name: the plan's ILP objective (``plan.objective``)."""
        return self.plan.objective

    def get_hlo_text(self) -> str:
        """Alpa's name for :meth:`hlo_text`."""
        return self.hlo_text()

    def memory_analysis(self):
        return self._compiled.memory_analysis()

    def get_total_allocation_size(self) -> int:
        """Alpa's figure: bytes XLA allocates per device for one call, arguments + outputs +
        temporaries, less the outputs that reuse donated arguments (``memory_analysis()``)."""
        m = self._compiled.memory_analysis()
        return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                   - m.alias_size_in_bytes)

    def cost_analysis(self):
        return self._compiled.cost_analysis()
