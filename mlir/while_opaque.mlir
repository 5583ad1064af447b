// RUN: alpa-pass-opt %s --extract
// A fori_loop: the while op is one OPAQUE node per result (its regions and the call inside them
// are never entered) and it is counted as a fallback.

// CHECK: // graph: 8 nodes, 1 args, 1 outputs, fallbacks: {stablehlo.while=1}
// CHECK-NEXT: %0 = parameter parameter [4,8]:4B () [0] arg0
// CHECK-NEXT: %1 = generator stablehlo.constant []:4B () [] constant
// CHECK-NEXT: %2 = opaque stablehlo.while []:4B (%1, %0) [] while at @main:1:0
// CHECK-NEXT: %3 = opaque stablehlo.while [4,8]:4B (%1, %0) [] while at @main:1:1
// CHECK-NOT: tanh
// CHECK: %6 = elementwise stablehlo.multiply [4,8]:4B (%3, %5) []
// CHECK-NEXT: %7 = output output [4,8]:4B (%6) [0] result
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
