"""emit.manual_ops: a batch-split FFT runs per shard inside an sdy.manual_computation."""
from __future__ import annotations

import pytest

from alpa_pass import _compat
from alpa_pass.emit.manual_ops import wrap_manual_ops
from alpa_pass.extract.stablehlo import parse_module

_MODULE = """
module {{
  sdy.mesh @mesh = <["x"=2, "y"=4]>
  func.func @main(%arg0: tensor<{n}x4x16xf32>) -> tensor<{n}x4x9xcomplex<f32>> {{
    %0 = stablehlo.fft %arg0, type = RFFT, length = [16] : (tensor<{n}x4x16xf32>) -> tensor<{n}x4x9xcomplex<f32>>
    %1 = sdy.sharding_constraint %0 <@mesh, [{dims}]> : tensor<{n}x4x9xcomplex<f32>>
    return %1 : tensor<{n}x4x9xcomplex<f32>>
  }}
}}
"""


def _wrapped(n: int, dims: str):
    module = parse_module(_MODULE.format(n=n, dims=dims), _compat.make_ir_context())
    count = wrap_manual_ops(module, "mesh")
    assert module.operation.verify()
    return count, str(module)


def test_a_batch_split_fft_runs_on_local_shapes_over_its_axes():
    count, text = _wrapped(8, '{"y", "x"}, {}, {}')
    assert count == 1
    assert 'manual_axes={"x", "y"}' in text  # (mesh order)
    assert 'in_shardings=[<@mesh, [{"y", "x"}, {}, {}]>] out_shardings=[<@mesh, [{"y", "x"}, {}, {}]>]' in text
    assert "(tensor<1x4x16xf32>) -> tensor<1x4x9xcomplex<f32>>" in text  # the fft, per shard
    assert "sdy.return" in text


def test_only_the_axes_that_split_it_are_manual():
    count, text = _wrapped(8, '{}, {"y"}, {}')
    assert count == 1 and 'manual_axes={"y"}' in text and "tensor<8x1x16xf32>" in text


@pytest.mark.parametrize("n,dims", [(8, '{}, {}, {"x"}'),  # a transformed dim split: XLA decides
                                    (6, '{"y"}, {}, {}'),  # uneven
                                    (8, '{}, {}, {}')])  # replicated
def test_other_shardings_are_left_to_xla(n, dims):
    count, text = _wrapped(n, dims)
    assert count == 0 and "manual_computation" not in text


def test_a_batch_split_top_k_runs_per_shard_with_both_results():
    text = """
module {
  sdy.mesh @mesh = <["x"=2, "y"=4]>
  func.func @main(%arg0: tensor<16x8xf32>) -> (tensor<16x2xf32>, tensor<16x2xi32>) {
    %0:2 = chlo.top_k(%arg0, k = 2) : tensor<16x8xf32> -> (tensor<16x2xf32>, tensor<16x2xi32>)
    %1 = sdy.sharding_constraint %0#0 <@mesh, [{"x", "y"}, {}]> : tensor<16x2xf32>
    return %1, %0#1 : tensor<16x2xf32>, tensor<16x2xi32>
  }
}
"""
    module = parse_module(text, _compat.make_ir_context())
    assert wrap_manual_ops(module, "mesh") == 1 and module.operation.verify()
    out = str(module)
    assert "out_shardings=[<@mesh, [{\"x\", \"y\"}, {}]>, <@mesh, [{\"x\", \"y\"}, {}]>]" in out
    assert "(tensor<2x8xf32>) -> (tensor<2x2xf32>, tensor<2x2xi32>)" in out or \
        "tensor<2x8xf32> -> (tensor<2x2xf32>, tensor<2x2xi32>)" in out
