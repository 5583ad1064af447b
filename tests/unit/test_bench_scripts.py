"""Every benchmark script runs from a fresh clone with only the ``bench`` extra: in a copy of
``benchmarks/`` and ``zoo/`` (no ``benchmarks/results/``, no ``tests/``) and with the test-only
packages unimportable, every module imports, every script answers ``--help``, and
``bench_pipeline.py --skip-gpt`` runs and creates the output folder it writes to. One child
process for all of it (jax is imported once)."""
import json
import pathlib
import shutil
import subprocess
import sys
import tomllib

from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[2]
# What `pip install -e '.[test]'` adds over `.[bench]`: a benchmark must not need any of it.
TEST_ONLY = ("pytest", "_pytest", "hypothesis", "equinox", "keras", "mpi4py", "orbax", "tests")

DRIVER = r'''
import contextlib, importlib, importlib.abc, io, json, os, pathlib, runpy, sys
clone, blocked, out_dir = pathlib.Path(sys.argv[1]), set(sys.argv[2].split(",")), sys.argv[3]

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"test-only module {name} imported by a benchmark", name=name)

sys.meta_path.insert(0, Block())
sys.path.insert(0, str(clone))
os.chdir(clone)
report = {"imported": [], "help": {}}
for path in sorted((clone / "benchmarks").rglob("*.py")):
    module = ".".join(path.relative_to(clone).with_suffix("").parts)
    if 'if __name__ == "__main__"' in path.read_text():
        sys.argv, text = [str(path), "--help"], io.StringIO()
        with contextlib.redirect_stdout(text):
            try:
                runpy.run_path(str(path), run_name="__main__")
                code = None
            except SystemExit as e:
                code = e.code
        report["help"][module] = [code, text.getvalue()]
    else:
        importlib.import_module(module.removesuffix(".__init__"))
        report["imported"].append(module)
sys.argv = ["bench_pipeline.py", "--skip-gpt", "--out", out_dir]
with contextlib.redirect_stdout(io.StringIO()):
    runpy.run_path(str(clone / "benchmarks" / "bench_pipeline.py"), run_name="__main__")
print("REPORT " + json.dumps(report))
'''


def test_bench_extra_covers_the_benchmarks():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"matplotlib", "optax"} <= set(extras["bench"])
    assert not set(extras["bench"]) & set(TEST_ONLY)


def test_every_benchmark_script_runs_from_a_fresh_clone(tmp_path):
    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "benchmarks", clone / "benchmarks",
                    ignore=shutil.ignore_patterns("results", "__pycache__", "*.png", "data"))
    shutil.copytree(ROOT / "zoo", clone / "zoo", ignore=shutil.ignore_patterns("__pycache__"))
    out_dir = tmp_path / "fresh" / "results"  # does not exist yet
    env = helpers.child_env(("ALPA_PASS_", "JAX_PLUGINS", "PYTHONPATH"))
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(clone), ",".join(TEST_ONLY), str(out_dir)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1][len("REPORT "):])
    scripts = {f"benchmarks.{p.stem}" for p in (ROOT / "benchmarks").glob("*.py")
               if 'if __name__ == "__main__"' in p.read_text()}
    assert set(report["help"]) == scripts and {"benchmarks.run_suite", "benchmarks.bench_pipeline",
                                               "benchmarks.mpi_case", "benchmarks.zoo_table"} <= scripts
    for module, (code, text) in report["help"].items():
        assert code == 0 and "usage:" in text, (module, code, text[-500:])
    assert {"benchmarks.baselines", "benchmarks.cost_model", "benchmarks.models.gpt_sizes"} <= set(report["imported"])
    written = list(out_dir.glob("pipeline_*.json"))
    assert len(written) == 1
    stage_dp = json.loads(written[0].read_text())["stage_dp"]
    assert stage_dp["layers"] == 48 and stage_dp["devices"] == 64 and stage_dp["num_stages"] >= 1


def test_the_gpu_check_runs_its_cpu_path_and_says_what_each_step_did(tmp_path):
    # scripts/gpu_check.sh is run on a lent GPU machine at most once a session: its CPU path is
    # checked here (no install, no zoo table), so a broken step shows before device time is spent
    out = tmp_path / "gc"
    env = helpers.child_env(("ALPA_PASS_", "JAX_PLUGINS", "XLA_FLAGS"), ALPA_PASS_GPU_CHECK_NO_INSTALL="1",
                            GPU_CHECK_ZOO="0", JAX_PLATFORMS="cpu", PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    device = json.loads((out / "device.json").read_text())
    assert device["platform"] == "cpu" and device["devices"] >= 1 and "jax" in device
    steps = [line.split() for line in (out / "steps.txt").read_text().splitlines()]
    assert [s[0] for s in steps] == ["device", "gpt-small"]  # no GPU: no profile, probe or large cases
    assert all(s[1] == "rc=0" for s in steps)
    assert "skipped: no GPU" in proc.stdout
