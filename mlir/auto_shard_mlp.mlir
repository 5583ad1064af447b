// RUN: alpa-pass-opt %s --auto-shard 1x4
// A 2-layer MLP reduced to a scalar: the cheapest plan splits the batch on "y" (the only
// communication is the all-reduce of the scalar sum: 2*beta*(3/4)*4 bytes = 6, plus its share of
// alpha, 4 bytes / 30 MiB: nothing waits for the sum, so XLA combines its all-reduce with others)
// and the compute each device does, 1e-4 per FLOP: the two dots' 4.19 MFLOP over 4 devices = 104.86,
// the relu and the reduce 0.26.

// CHECK: // auto-shard: mesh 1x4, objective 111.1
// CHECK-NEXT: module @jit_f attributes {mhlo.num_partitions = 4 : i32
// CHECK-NEXT: sdy.mesh @mesh = <["x"=1, "y"=4]>
// CHECK-NEXT: func.func public @main(%arg0: tensor<8x256xf32> {sdy.sharding = #sdy.sharding<@mesh,
// CHECK: %1 = sdy.sharding_constraint %0 <@mesh, [{"y"}, {}]> : tensor<8x512xf32>
// CHECK: %4 = sdy.sharding_constraint %3 <@mesh, [{"y"}, {}]> : tensor<8x256xf32>
// CHECK: stablehlo.reduce(%4 init: %cst)
// CHECK-NOT: all_gather
module @jit_f attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<8x256xf32>, %arg1: tensor<256x512xf32>, %arg2: tensor<512x256xf32>) -> (tensor<f32> {jax.result_info = "result"}) {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<8x256xf32>, tensor<256x512xf32>) -> tensor<8x512xf32>
    %1 = call @relu(%0) : (tensor<8x512xf32>) -> tensor<8x512xf32>
    %2 = stablehlo.dot_general %1, %arg2, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<8x512xf32>, tensor<512x256xf32>) -> tensor<8x256xf32>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %3 = stablehlo.reduce(%2 init: %cst) applies stablehlo.add across dimensions = [0, 1] : (tensor<8x256xf32>, tensor<f32>) -> tensor<f32>
    return %3 : tensor<f32>
  }
  func.func private @relu(%arg0: tensor<8x512xf32>) -> tensor<8x512xf32> {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<8x512xf32>
    %1 = stablehlo.maximum %arg0, %0 : tensor<8x512xf32>
    return %1 : tensor<8x512xf32>
  }
}

