"""Run a training script unchanged (``python run_script.py SCRIPT``), then print one JSON line
starting with ``ALPA_PASS_RUN`` that says what alpa_pass did behind its back.

Fields: ``compiles`` (function name -> XLA compilations of it during the run), ``plugin`` (alpa_pass.plugin.stats()
or null when JAX never imported the plugin), ``heavy_modules`` (alpa_pass planning modules, the C++
core, highspy: which of them were imported).
"""
import collections
import json
import logging
import re
import runpy
import sys

import jax

HEAVY = ("alpa_pass._core", "alpa_pass.driver.planning", "alpa_pass.extract.stablehlo",
         "alpa_pass.emit.constraints", "highspy")


class _CompileCounter(logging.Handler):
    _DONE = re.compile(r"Finished XLA compilation of jit\((\w+)\)")

    def __init__(self, counter):
        super().__init__(logging.DEBUG)
        self.counter = counter

    def emit(self, record):
        m = self._DONE.search(record.getMessage())
        if m:
            self.counter[m.group(1)] += 1


def main():
    compiles = collections.Counter()
    jax.config.update("jax_log_compiles", True)
    logging.getLogger("jax").addHandler(_CompileCounter(compiles))
    logging.getLogger("jax").propagate = False  # keep jax's compile log off stderr
    runpy.run_path(sys.argv[1], run_name="__main__")
    plugin = sys.modules.get("alpa_pass.plugin")
    print("ALPA_PASS_RUN " + json.dumps({
        "compiles": dict(compiles),
        "plugin": plugin.stats() if plugin is not None else None,
        "heavy_modules": sorted(m for m in HEAVY if m in sys.modules)}))


if __name__ == "__main__":
    main()
