// RUN: alpa-pass-opt %s --annotate %S/annotate.json
// annotate.json asks for: the dot (%2) split [x, y]; the multiply (%3) in main [y, -];
// the sine of the first call only (%4, skipped: the second call path asks for nothing);
// the multiply in @g for both calls with the same spec (%7 and %11, one constraint);
// a constant (%5, skipped) and the parameter %0 (skipped).

// CHECK: // inserted 3 constraints, skipped: {call_path_conflict=1, generator=1, parameter_or_output=1}
// CHECK: sdy.mesh @mesh = <["x"=2, "y"=4]>
// CHECK: %0 = stablehlo.dot_general %arg1, %arg0
// CHECK-NEXT: %1 = sdy.sharding_constraint %0 <@mesh, [{"x"}, {"y"}]> : tensor<4x16xf32>
// CHECK-NEXT: %2 = stablehlo.multiply %1, %1
// CHECK-NEXT: %3 = sdy.sharding_constraint %2 <@mesh, [{"y"}, {}]> : tensor<4x16xf32>
// CHECK-NEXT: %4 = call @g(%3)
// CHECK-NEXT: %5 = call @g(%4)
// CHECK-NEXT: return %5
// CHECK: func.func private @g
// CHECK-NEXT: %0 = stablehlo.sine %arg0
// CHECK-NOT: sharding_constraint
// CHECK: %2 = stablehlo.multiply %0, %1
// (a dim split over several axes lists them in one order, mesh order here: a plan's axis_order,
// the order the core priced its reshards in; see emit.constraints)
// CHECK-NEXT: %3 = sdy.sharding_constraint %2 <@mesh, [{}, {"x", "y"}]> : tensor<4x16xf32>
// CHECK-NEXT: return %3
module @jit_f attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=2, "y"=4]>
  func.func public @main(%arg0: tensor<8x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}, %arg1: tensor<4x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}) -> (tensor<4x16xf32> {jax.result_info = "result", sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}) {
    %0 = stablehlo.dot_general %arg1, %arg0, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
    %1 = stablehlo.multiply %0, %0 : tensor<4x16xf32>
    %2 = call @g(%1) : (tensor<4x16xf32>) -> tensor<4x16xf32>
    %3 = call @g(%2) : (tensor<4x16xf32>) -> tensor<4x16xf32>
    return %3 : tensor<4x16xf32>
  }
  func.func private @g(%arg0: tensor<4x16xf32>) -> tensor<4x16xf32> {
    %0 = stablehlo.sine %arg0 : tensor<4x16xf32>
    %cst = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %1 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4x16xf32>
    %2 = stablehlo.multiply %0, %1 : tensor<4x16xf32>
    return %2 : tensor<4x16xf32>
  }
}
