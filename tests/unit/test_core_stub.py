"""python/alpa_pass/_core.pyi is exactly what nanobind's stub generator makes of the built core.

After changing cpp/bindings/module.cc, rebuild and regenerate the checked-in stub with

    python -m nanobind.stubgen -q -m alpa_pass._core -o python/alpa_pass/_core.pyi

The text depends on nanobind's version (both the one that compiled the extension and the one that
runs stubgen), so pyproject.toml pins one nanobind for the build and the test extras; with another
version installed, or none, the check is skipped, saying why.
"""
import pathlib
import re
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
STUB = ROOT / "python" / "alpa_pass" / "_core.pyi"
REGENERATE = "python -m nanobind.stubgen -q -m alpa_pass._core -o python/alpa_pass/_core.pyi"


def _pinned_nanobind() -> str:
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    pins = [m.group(1) for r in requires if (m := re.fullmatch(r"nanobind==([\w.]+)", r.strip()))]
    assert len(pins) == 1, f"pyproject.toml must pin nanobind==X for the build, got {requires}"
    return pins[0]


def test_checked_in_stub_matches_the_extension(tmp_path):
    nanobind = pytest.importorskip(
        "nanobind", reason="nanobind (the stub generator) is not installed here: pip install -e '.[test]'")
    pinned = _pinned_nanobind()
    if nanobind.__version__ != pinned:
        pytest.skip(f"nanobind {nanobind.__version__} is installed but the stub is generated with the "
                    f"pinned {pinned} (pyproject.toml)")
    out = tmp_path / "_core.pyi"
    subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "alpa_pass._core", "-o", str(out)],
                   check=True, cwd=tmp_path)
    assert out.read_text() == STUB.read_text(), f"python/alpa_pass/_core.pyi is stale; run: {REGENERATE}"

