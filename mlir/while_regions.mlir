// RUN: alpa-pass-opt %s --extract
// A fori_loop: the while's cond and body ops are nodes like top-level ops (their locators name the
// region: 1.r0 = region 0 of op 1), calls inside the body are followed, each carried slot has a
// carry node (what the regions' block argument reads) and a result node; no fallback.

// CHECK: // graph: 15 nodes, 1 args, 1 outputs, fallbacks: {}
// CHECK-NEXT: %0 = parameter parameter [4,8]:4B () [0] arg0
// CHECK-NEXT: %1 = generator stablehlo.constant []:4B () [] constant
// CHECK-NEXT: %2 = elementwise stablehlo.while []:4B (%1) [] carry0 at @main:-3:0
// CHECK-NEXT: %3 = elementwise stablehlo.while [4,8]:4B (%0) [] carry1 at @main:-3:1
// CHECK-NEXT: %4 = generator stablehlo.constant []:4B () [] constant at @main:1.r0/0:0
// CHECK-NEXT: %5 = elementwise stablehlo.compare []:1B (%2, %4) [] compare at @main:1.r0/1:0
// CHECK-NEXT: %6 = elementwise stablehlo.tanh [4,8]:4B (%3) [] tanh at @closed_call:0:0
// CHECK-NEXT: %7 = generator stablehlo.constant []:4B () [] constant at @main:1.r1/1:0
// CHECK-NEXT: %8 = elementwise stablehlo.add []:4B (%2, %7) [] add at @main:1.r1/2:0
// CHECK-NEXT: %9 = elementwise stablehlo.while []:4B (%8) [] while at @main:1:0
// CHECK-NEXT: %10 = elementwise stablehlo.while [4,8]:4B (%6) [] while at @main:1:1
// CHECK: %13 = elementwise stablehlo.multiply [4,8]:4B (%10, %12) []
// CHECK-NEXT: %14 = output output [4,8]:4B (%13) [0] result
module @jit_wl {
  func.func public @main(%arg0: tensor<4x8xf32>) -> (tensor<4x8xf32> {jax.result_info = "result"}) {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0:2 = stablehlo.while(%iterArg = %c, %iterArg_0 = %arg0) : tensor<i32>, tensor<4x8xf32>
    cond {
      %c_1 = stablehlo.constant dense<3> : tensor<i32>
      %3 = stablehlo.compare LT, %iterArg, %c_1, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %3 : tensor<i1>
    } do {
      %3 = func.call @closed_call(%iterArg_0) : (tensor<4x8xf32>) -> tensor<4x8xf32>
      %c_1 = stablehlo.constant dense<1> : tensor<i32>
      %4 = stablehlo.add %iterArg, %c_1 : tensor<i32>
      stablehlo.return %4, %3 : tensor<i32>, tensor<4x8xf32>
    }
    %cst = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %1 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4x8xf32>
    %2 = stablehlo.multiply %0#1, %1 : tensor<4x8xf32>
    return %2 : tensor<4x8xf32>
  }
  func.func private @closed_call(%arg0: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %0 = stablehlo.tanh %arg0 : tensor<4x8xf32>
    return %0 : tensor<4x8xf32>
  }
}
