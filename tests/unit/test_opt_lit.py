"""Text-in, text-out tests: every ``mlir/*.mlir`` runs through ``alpa-pass-opt`` and is checked
against its ``// CHECK`` lines with a small FileCheck-like matcher.

File format: one ``// RUN: alpa-pass-opt ARGS`` line (``%s`` = this file, ``%S`` = its folder),
then ``// CHECK: text`` (a later output line contains text), ``// CHECK-NEXT: text`` (the line
right after the previous match contains text) and ``// CHECK-NOT: text`` (no line between the
previous match and the next positive match, or the end, contains text).
"""
from __future__ import annotations

import contextlib
import io
import pathlib
import re
import shlex

import pytest

from alpa_pass.tools import opt

MLIR_DIR = pathlib.Path(__file__).resolve().parents[2] / "mlir"
_DIRECTIVE = re.compile(r"^\s*//\s*(RUN|CHECK|CHECK-NEXT|CHECK-NOT):\s?(.*)$")


class CheckFailure(AssertionError):
    pass


def parse_directives(text: str) -> tuple[list[str], list[tuple[str, str]]]:
    """(RUN argv after the tool name, [(directive, pattern)]) of a test file's text."""
    run, checks = None, []
    for line in text.splitlines():
        m = _DIRECTIVE.match(line)
        if not m:
            continue
        if m.group(1) == "RUN":
            run = shlex.split(m.group(2))
        else:
            checks.append((m.group(1), m.group(2).rstrip()))
    if run is None or run[0] != "alpa-pass-opt":
        raise CheckFailure("test file needs a '// RUN: alpa-pass-opt ...' line")
    return run[1:], checks


def _check_not(lines, lo, hi, pattern):
    for j in range(lo, hi):
        if pattern in lines[j]:
            raise CheckFailure(f"CHECK-NOT: {pattern!r} found on output line {j + 1}: {lines[j]!r}")


def filecheck(output: str, checks: list[tuple[str, str]]) -> None:
    """Raise CheckFailure unless ``output`` satisfies ``checks`` (substring match per line)."""
    lines = output.splitlines()
    pos = 0            # first line a CHECK may match
    pending_not = []   # CHECK-NOT patterns waiting for the next positive match
    for directive, pattern in checks:
        if directive == "CHECK-NOT":
            pending_not.append(pattern)
            continue
        if directive == "CHECK-NEXT":
            if pos >= len(lines) or pattern not in lines[pos]:
                got = lines[pos] if pos < len(lines) else "<end of output>"
                raise CheckFailure(f"CHECK-NEXT: {pattern!r} not on line {pos + 1}: {got!r}")
            found = pos
        else:
            found = next((j for j in range(pos, len(lines)) if pattern in lines[j]), None)
            if found is None:
                raise CheckFailure(f"CHECK: {pattern!r} not found after line {pos}")
        for p in pending_not:
            _check_not(lines, pos, found, p)
        pending_not, pos = [], found + 1
    for p in pending_not:
        _check_not(lines, pos, len(lines), p)


def run_file(path: pathlib.Path) -> str:
    """Run the file's RUN line through ``opt.main`` and return its stdout."""
    argv, _ = parse_directives(path.read_text())
    argv = [a.replace("%s", str(path)).replace("%S", str(path.parent)) for a in argv]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = opt.main(argv)
    assert rc == 0, f"alpa-pass-opt {' '.join(argv)} exited with {rc}"
    return out.getvalue()


MLIR_FILES = sorted(MLIR_DIR.glob("*.mlir"))


def test_mlir_files_exist():
    names = {p.stem for p in MLIR_FILES}
    assert {"extract_mlp", "call_twice", "while_regions", "gather_scatter", "convolution",
            "annotate"} <= names


@pytest.mark.parametrize("path", MLIR_FILES, ids=lambda p: p.name)
def test_mlir_file(path):
    _, checks = parse_directives(path.read_text())
    assert checks, f"{path.name} has no CHECK lines"
    filecheck(run_file(path), checks)


# ---- the matcher itself ---------------------------------------------------------------------

_OUT = "a 1\nb 2\nc 3\nd 4"


@pytest.mark.parametrize("checks", [
    [("CHECK", "b"), ("CHECK-NEXT", "c")],
    [("CHECK", "a"), ("CHECK-NOT", "z"), ("CHECK", "d")],
    [("CHECK", "a"), ("CHECK", "d"), ("CHECK-NOT", "a")],
    [("CHECK-NOT", "x"), ("CHECK", "c 3")],
])
def test_filecheck_accepts(checks):
    filecheck(_OUT, checks)


@pytest.mark.parametrize("checks, message", [
    ([("CHECK", "b"), ("CHECK-NEXT", "d")], "CHECK-NEXT: 'd' not on line 3"),
    ([("CHECK", "c"), ("CHECK", "b")], "CHECK: 'b' not found after line 3"),
    ([("CHECK", "a"), ("CHECK-NOT", "b"), ("CHECK", "c")], "CHECK-NOT: 'b' found on output line 2"),
    ([("CHECK", "b"), ("CHECK-NOT", "d")], "found on output line 4"),
    ([("CHECK", "d"), ("CHECK-NEXT", "e")], "<end of output>"),
])
def test_filecheck_rejects(checks, message):
    with pytest.raises(CheckFailure, match=re.escape(message)):
        filecheck(_OUT, checks)


def test_opt_reports_errors(tmp_path, capsys):
    bad = tmp_path / "dyn.mlir"
    bad.write_text("func.func @main(%a: tensor<?x4xf32>) -> tensor<?x4xf32> {\n"
                   "  return %a : tensor<?x4xf32>\n}\n")
    assert opt.main([str(bad), "--extract"]) == 1
    assert "static shapes" in capsys.readouterr().err
