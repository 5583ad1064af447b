"""emit/accumulation.py on a hand-written module (text in, structure out): a while loop summing a
dot whose contracted dim is split over "x" into a zero-initialised carry."""
from __future__ import annotations

import re

import pytest

from alpa_pass.emit.accumulation import rewrite_accumulations
from alpa_pass.extract.stablehlo import parse_module
from alpa_pass.mesh import LogicalMesh

MODULE = """
module {
  sdy.mesh @mesh = <["x"=2, "y"=4]>
  func.func @main(%a: tensor<8x16xf32>, %b: tensor<8x32xf32>) -> tensor<16x32xf32> {
    %zero = stablehlo.constant dense<INIT> : tensor<f32>
    %init = stablehlo.broadcast_in_dim %zero, dims = [] : (tensor<f32>) -> tensor<16x32xf32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %r:2 = stablehlo.while(%i = %c0, %acc = %init) : tensor<i32>, tensor<16x32xf32>
    cond {
      %n = stablehlo.constant dense<4> : tensor<i32>
      %p = stablehlo.compare LT, %i, %n, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %p : tensor<i1>
    } do {
      %l = sdy.sharding_constraint %a <@mesh, [{"x"}, {}]> : tensor<8x16xf32>
      %rr = sdy.sharding_constraint %b <@mesh, [{"x"}, {}]> : tensor<8x32xf32>
      %g = stablehlo.dot_general %l, %rr, contracting_dims = [0] x [0] : (tensor<8x16xf32>, tensor<8x32xf32>) -> tensor<16x32xf32>
      %gc = sdy.sharding_constraint %g <@mesh, [{}, {"y"}]> : tensor<16x32xf32>
      %s = stablehlo.add %acc, %gc : tensor<16x32xf32>
      %sc = sdy.sharding_constraint %s <@mesh, [{}, {"y"}]> : tensor<16x32xf32>
      %one = stablehlo.constant dense<1> : tensor<i32>
      %i1 = stablehlo.add %i, %one : tensor<i32>
      stablehlo.return %i1, %sc : tensor<i32>, tensor<16x32xf32>
    }
    return %r#1 : tensor<16x32xf32>
  }
}
"""
MESH = LogicalMesh(shape=(2, 4), axis_names=("x", "y"))


def test_partial_sums_carried_per_shard_and_reduced_after_the_loop():
    module = parse_module(MODULE.replace("INIT", "0.000000e+00"))
    assert rewrite_accumulations(module, MESH) == 1
    text = str(module.operation)
    assert "tensor<i32>, tensor<2x16x32xf32>" in text  # the carry: one [16, 32] partial sum per "x" shard
    assert re.search(r"dot_general .*batching_dims = \[0\] x \[0\], contracting_dims = \[1\] x \[1\]", text)
    assert '<@mesh, [{"x"}, {}, {"y"}]>' in text       # the carry's layout: "x" on the new dim
    after = text[text.index("stablehlo.while"):]
    after = after[after.index("    }\n    ") :]       # the entry function after the loop
    assert re.search(r"stablehlo.reduce\(%\S+ init: %\S+\) applies stablehlo.add across dimensions = \[0\] "
                     r": \(tensor<2x16x32xf32>, tensor<f32>\) -> tensor<16x32xf32>", after)


@pytest.mark.parametrize("init", ["1.000000e+00"])
def test_a_carry_that_does_not_start_at_zero_is_left_alone(init):
    module = parse_module(MODULE.replace("INIT", init))
    before = str(module.operation)
    assert rewrite_accumulations(module, MESH) == 0
    assert str(module.operation) == before


FANOUT = """
module {
  sdy.mesh @mesh = <["x"=2, "y"=4]>
  func.func @main(%a: tensor<8x16xf32>, %b: tensor<8x32xf32>) -> (tensor<16x16xf32>, tensor<16x16xf32>) {
    %zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %init = stablehlo.broadcast_in_dim %zero, dims = [] : (tensor<f32>) -> tensor<16x16xf32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %r:4 = stablehlo.while(%i = %c0, %acc0 = %init, %acc1 = %init, %last = %init) : tensor<i32>, tensor<16x16xf32>, tensor<16x16xf32>, tensor<16x16xf32>
    cond {
      %n = stablehlo.constant dense<4> : tensor<i32>
      %p = stablehlo.compare LT, %i, %n, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %p : tensor<i1>
    } do {
      %l = sdy.sharding_constraint %a <@mesh, [{"x"}, {}]> : tensor<8x16xf32>
      %rr = sdy.sharding_constraint %b <@mesh, [{"x"}, {}]> : tensor<8x32xf32>
      %g = stablehlo.dot_general %rr, %l, contracting_dims = [0] x [0] : (tensor<8x32xf32>, tensor<8x16xf32>) -> tensor<32x16xf32>
      %gc = sdy.sharding_constraint %g <@mesh, [{}, {"y"}]> : tensor<32x16xf32>
      %t = stablehlo.transpose %gc, dims = [1, 0] : (tensor<32x16xf32>) -> tensor<16x32xf32>
      %g0 = stablehlo.slice %t [0:16, 0:16] : (tensor<16x32xf32>) -> tensor<16x16xf32>
      %g1 = stablehlo.slice %t [0:16, 16:32] : (tensor<16x32xf32>) -> tensor<16x16xf32>
      %s0 = stablehlo.add %acc0, %g0 : tensor<16x16xf32>
      %s1 = stablehlo.add %g1, %acc1 : tensor<16x16xf32>
      %one = stablehlo.constant dense<1> : tensor<i32>
      %i1 = stablehlo.add %i, %one : tensor<i32>
      stablehlo.return %i1, %s0, %s1, LAST : tensor<i32>, tensor<16x16xf32>, tensor<16x16xf32>, tensor<16x16xf32>
    }
    return %r#1, %r#2 : tensor<16x16xf32>, tensor<16x16xf32>
  }
}
"""


def test_a_gradient_sliced_into_several_accumulators_is_carried_per_shard():
    """A fused kernel's gradient (one dot, transposed, sliced into two parameters' gradients, as
    flax's OptimizedLSTMCell's gates are): both carries get per-shard partial sums, the dot is
    split once, the slices keep the whole leading dim."""
    module = parse_module(FANOUT.replace("LAST", "%last"))
    assert rewrite_accumulations(module, MESH) == 2
    text = str(module.operation)
    assert text.count("stablehlo.dot_general") == 1
    assert re.search(r"dot_general .*batching_dims = \[0\] x \[0\], contracting_dims = \[1\] x \[1\]", text)
    assert "tensor<i32>, tensor<2x16x16xf32>, tensor<2x16x16xf32>, tensor<16x16xf32>" in text
    assert re.search(r"stablehlo.slice %\S+ \[0:2, 0:16, 16:32\] : "
                     r"\(tensor<2x16x32xf32>\) -> tensor<2x16x16xf32>", text)
    after = text[text.index("stablehlo.while"):]
    after = after[after.index("    }\n    "):]
    assert len(re.findall(r"applies stablehlo.add across dimensions = \[0\] : \(tensor<2x16x16xf32>", after)) == 2


def test_a_sliced_gradient_read_outside_its_accumulators_is_left_alone():
    """One slice of the tree also feeds another carry (not an accumulator): the per-shard partial
    sums would leak into it, so no slot of the tree is rewritten."""
    module = parse_module(FANOUT.replace("LAST", "%g1"))
    before = str(module.operation)
    assert rewrite_accumulations(module, MESH) == 0
    assert str(module.operation) == before


TWO_STAGES = """
module {
  sdy.mesh @mesh = <["x"=2, "y"=4]>
  func.func @main(%a: tensor<8x16xf32>, %b: tensor<8x32xf32>, %c: tensor<8x32xf32>) -> tensor<16x32xf32> {
    %zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %init = stablehlo.broadcast_in_dim %zero, dims = [] : (tensor<f32>) -> tensor<16x32xf32>
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %r:2 = stablehlo.while(%i = %c0, %acc = %init) : tensor<i32>, tensor<16x32xf32>
    cond {
      %n = stablehlo.constant dense<4> : tensor<i32>
      %p = stablehlo.compare LT, %i, %n, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %p : tensor<i1>
    } do {
      %l = sdy.sharding_constraint %a <@mesh, [{"x"}, {}]> : tensor<8x16xf32>
      %rr = sdy.sharding_constraint %b <@mesh, [{"x"}, {}]> : tensor<8x32xf32>
      %r2 = sdy.sharding_constraint %c <@mesh, [{SECOND}, {}]> : tensor<8x32xf32>
      %g1 = stablehlo.dot_general %l, %rr, contracting_dims = [0] x [0] : (tensor<8x16xf32>, tensor<8x32xf32>) -> tensor<16x32xf32>
      %g2 = stablehlo.dot_general %l, %r2, contracting_dims = [0] x [0] : (tensor<8x16xf32>, tensor<8x32xf32>) -> tensor<16x32xf32>
      %s1 = stablehlo.add %acc, %g1 : tensor<16x32xf32>
      %s1c = sdy.sharding_constraint %s1 <@mesh, [{}, {"y"}]> : tensor<16x32xf32>
      %s2 = stablehlo.add %s1c, %g2 : tensor<16x32xf32>
      %one = stablehlo.constant dense<1> : tensor<i32>
      %i1 = stablehlo.add %i, %one : tensor<i32>
      stablehlo.return %i1, %s2 : tensor<i32>, tensor<16x32xf32>
    }
    return %r#1 : tensor<16x32xf32>
  }
}
"""


def test_stage_gradients_added_in_turn_are_carried_per_shard():
    """``acc + g1 + g2`` (an RK4 step adds its stages' weight gradients in turn): both dots split
    their contracted pair over "x" and make it a batch dim, the inner add and its constraint carry
    the leading [2] dim, one reduce after the loop."""
    module = parse_module(TWO_STAGES.replace("SECOND", '"x"'))
    assert rewrite_accumulations(module, MESH) == 1
    text = str(module.operation)
    assert len(re.findall(r"dot_general .*batching_dims = \[0\] x \[0\], contracting_dims = \[1\] x \[1\]", text)) == 2
    assert "tensor<i32>, tensor<2x16x32xf32>" in text
    assert re.search(r'sharding_constraint %\S+ <@mesh, \[\{"x"\}, \{\}, \{"y"\}\]> : tensor<2x16x32xf32>', text)
    assert re.search(r"stablehlo.add %\S+, %\S+ : tensor<2x16x32xf32>", text)
    after = text[text.index("stablehlo.while"):]
    after = after[after.index("    }\n    "):]
    assert len(re.findall(r"applies stablehlo.add across dimensions = \[0\] : \(tensor<2x16x32xf32>", after)) == 1


def test_stage_gradients_split_over_other_axes_are_left_alone():
    """The second stage's dot splits its contracted pair over "y" (or not at all): the partial sums
    of the two would need different leading dims, so the slot is left as it is."""
    for second in ('"y"', ""):
        module = parse_module(TWO_STAGES.replace("SECOND", second))
        before = str(module.operation)
        assert rewrite_accumulations(module, MESH) == 0
        assert str(module.operation) == before
