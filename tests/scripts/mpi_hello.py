"""Prints one JSON line: process index and count, global and local device counts, sys.argv and
__name__ as the launcher ran it. With ``--fail`` it then raises."""
import json
import sys

import jax

print(json.dumps({"process_index": jax.process_index(), "process_count": jax.process_count(),
                  "device_count": jax.device_count(), "local_device_count": jax.local_device_count(),
                  "argv": sys.argv[1:], "name": __name__}), flush=True)
if "--fail" in sys.argv:
    raise ValueError("asked to fail")
