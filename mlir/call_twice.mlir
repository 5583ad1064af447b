// RUN: alpa-pass-opt %s --extract
// A jitted helper called twice: each call path gets its own nodes, bound to the caller's values.

// CHECK: // graph: 10 nodes, 1 args, 1 outputs, fallbacks: {}
// CHECK-NEXT: %0 = parameter parameter [4,16]:4B () [0] x at @main:-1:0
// CHECK-NEXT: %1 = elementwise stablehlo.sine [4,16]:4B (%0) [] sine at @g:0:0 via @main:0
// CHECK-NEXT: %2 = generator stablehlo.constant []:4B () [] constant at @g:1:0 via @main:0
// CHECK-NEXT: %3 = broadcast stablehlo.broadcast_in_dim [4,16]:4B (%2) [] broadcast_in_dim at @g:2:0 via @main:0
// CHECK-NEXT: %4 = elementwise stablehlo.multiply [4,16]:4B (%1, %3) [] multiply at @g:3:0 via @main:0
// CHECK-NEXT: %5 = elementwise stablehlo.sine [4,16]:4B (%4) [] sine at @g:0:0 via @main:1
// CHECK: %8 = elementwise stablehlo.multiply [4,16]:4B (%5, %7) [] multiply at @g:3:0 via @main:1
// CHECK-NEXT: %9 = output output [4,16]:4B (%8) [0] result[0] at @main:-2:0
// CHECK-NOT: func.call
module @jit_f {
  func.func public @main(%arg0: tensor<4x16xf32> loc("x")) -> (tensor<4x16xf32> {jax.result_info = "result[0]"}) {
    %0 = call @g(%arg0) : (tensor<4x16xf32>) -> tensor<4x16xf32>
    %1 = call @g(%0) : (tensor<4x16xf32>) -> tensor<4x16xf32>
    return %1 : tensor<4x16xf32>
  }
  func.func private @g(%arg0: tensor<4x16xf32>) -> tensor<4x16xf32> {
    %0 = stablehlo.sine %arg0 : tensor<4x16xf32>
    %cst = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %1 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4x16xf32>
    %2 = stablehlo.multiply %0, %1 : tensor<4x16xf32>
    return %2 : tensor<4x16xf32>
  }
}
