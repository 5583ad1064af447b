import atexit
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # the models (zoo) and tests.helpers, whatever the working directory

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Plans use this cluster's cached cost profile by default (AutoShardingOption(profile="auto")): the
# suite looks in an empty directory of its own, so that a profile cached on the machine (by
# `alpa-pass profile`) never changes what the tests plan. Tests of the lookup set their own.
os.environ["ALPA_PASS_PROFILE_DIR"] = tempfile.mkdtemp(prefix="alpa_pass_test_profiles_")
atexit.register(shutil.rmtree, os.environ["ALPA_PASS_PROFILE_DIR"], ignore_errors=True)

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

# Property tests draw the same examples on every run (a suite that passes once passes again, under
# any load); ALPA_PASS_HYPOTHESIS=explore draws fresh random ones, to hunt for new failures (add
# each one found as an @example).
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False, database=None)
settings.load_profile(os.environ.get("ALPA_PASS_HYPOTHESIS", "ci"))
