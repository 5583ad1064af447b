// RUN: alpa-pass-opt %s --extract
// An MLP forward pass and mean-squared-error loss (jax.jit(mlp).lower(...).as_text()).

// CHECK: // graph: 16 nodes, 4 args, 1 outputs, fallbacks: {}
// CHECK-NEXT: %0 = parameter parameter [16,32]:4B () [0] w1
// CHECK-NEXT: %1 = parameter parameter [32,8]:4B () [1] arg1
// CHECK: %4 = dot stablehlo.dot_general [4,32]:4B (%2, %0) [0,1,1,0] dot_general@mlp.py:3
// CHECK-NEXT: %5 = generator stablehlo.constant []:4B () []
// CHECK-NEXT: %6 = broadcast stablehlo.broadcast_in_dim [4,32]:4B (%5) []
// CHECK-NEXT: %7 = elementwise stablehlo.maximum [4,32]:4B (%4, %6) []
// CHECK-NEXT: %8 = dot stablehlo.dot_general [4,8]:4B (%7, %1) [0,1,1,0] dot_general
// CHECK-NOT: opaque
// CHECK: %12 = reduce stablehlo.reduce []:4B (%10, %11) [0,1] reduce
// CHECK: %14 = elementwise stablehlo.divide []:4B (%12, %13) []
// CHECK-NEXT: %15 = output output []:4B (%14) [0] result
module @jit_mlp {
  func.func public @main(%arg0: tensor<16x32xf32> loc("w1"), %arg1: tensor<32x8xf32>, %arg2: tensor<4x16xf32>, %arg3: tensor<4x8xf32>) -> (tensor<f32> {jax.result_info = "result"}) {
    %0 = stablehlo.dot_general %arg2, %arg0, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x16xf32>, tensor<16x32xf32>) -> tensor<4x32xf32> loc("jit(mlp)/dot_general"("/src/mlp.py":3:8))
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %1 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4x32xf32>
    %2 = stablehlo.maximum %0, %1 : tensor<4x32xf32>
    %3 = stablehlo.dot_general %2, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x32xf32>, tensor<32x8xf32>) -> tensor<4x8xf32>
    %4 = stablehlo.subtract %3, %arg3 : tensor<4x8xf32>
    %5 = stablehlo.multiply %4, %4 : tensor<4x8xf32>
    %cst_0 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %6 = stablehlo.reduce(%5 init: %cst_0) applies stablehlo.add across dimensions = [0, 1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<f32>
    %cst_1 = stablehlo.constant dense<3.200000e+01> : tensor<f32>
    %7 = stablehlo.divide %6, %cst_1 : tensor<f32>
    return %7 : tensor<f32>
  }
}
