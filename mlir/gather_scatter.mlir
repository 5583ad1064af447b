// RUN: alpa-pass-opt %s --extract
// jnp.take (gather, inside a called function) and .at[].add (a single-input scatter).
// GATHER attrs: index_vector_dim, then counted lists offset_dims, collapsed_slice_dims,
// start_index_map, operand_batching_dims, start_indices_batching_dims, slice_sizes.
// SCATTER attrs: index_vector_dim, then counted lists update_window_dims, inserted_window_dims,
// scatter_dims_to_operand_dims, input_batching_dims, scatter_indices_batching_dims.

// CHECK: %3 = broadcast stablehlo.broadcast_in_dim [3,1]:4B (%1) [0]
// CHECK-NEXT: %4 = gather stablehlo.gather [3,8]:4B (%0, %3) [1,1,1,1,0,1,0,0,0,2,1,8] gather at @_take:1:0 via @main:0
// CHECK: %11 = elementwise stablehlo.select [3]:4B (%7, %10, %1) []
// CHECK-NEXT: %12 = broadcast stablehlo.broadcast_in_dim [3,1]:4B (%11) [0]
// CHECK-NEXT: %13 = scatter stablehlo.scatter [10,8]:4B (%0, %12, %2) [1,1,1,1,0,1,0,0,0] scatter
// CHECK-NEXT: %14 = output output [3,8]:4B (%4) [0] result[0]
// CHECK-NEXT: %15 = output output [10,8]:4B (%13) [1] result[1]
module @jit_gs {
  func.func public @main(%arg0: tensor<10x8xf32>, %arg1: tensor<3xi32>, %arg2: tensor<3x8xf32>) -> (tensor<3x8xf32> {jax.result_info = "result[0]"}, tensor<10x8xf32> {jax.result_info = "result[1]"}) {
    %0 = call @_take(%arg0, %arg1) : (tensor<10x8xf32>, tensor<3xi32>) -> tensor<3x8xf32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %1 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<3xi32>
    %2 = stablehlo.compare LT, %arg1, %1, SIGNED : (tensor<3xi32>, tensor<3xi32>) -> tensor<3xi1>
    %c_0 = stablehlo.constant dense<10> : tensor<i32>
    %3 = stablehlo.broadcast_in_dim %c_0, dims = [] : (tensor<i32>) -> tensor<3xi32>
    %4 = stablehlo.add %arg1, %3 : tensor<3xi32>
    %5 = stablehlo.select %2, %4, %arg1 : tensor<3xi1>, tensor<3xi32>
    %6 = stablehlo.broadcast_in_dim %5, dims = [0] : (tensor<3xi32>) -> tensor<3x1xi32>
    %7 = "stablehlo.scatter"(%arg0, %6, %arg2) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}> ({
    ^bb0(%arg3: tensor<f32>, %arg4: tensor<f32>):
      %8 = stablehlo.add %arg3, %arg4 : tensor<f32>
      stablehlo.return %8 : tensor<f32>
    }) : (tensor<10x8xf32>, tensor<3x1xi32>, tensor<3x8xf32>) -> tensor<10x8xf32>
    return %0, %7 : tensor<3x8xf32>, tensor<10x8xf32>
  }
  func.func private @_take(%arg0: tensor<10x8xf32>, %arg1: tensor<3xi32>) -> tensor<3x8xf32> {
    %0 = stablehlo.broadcast_in_dim %arg1, dims = [0] : (tensor<3xi32>) -> tensor<3x1xi32>
    %1 = "stablehlo.gather"(%arg0, %0) <{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 8>}> : (tensor<10x8xf32>, tensor<3x1xi32>) -> tensor<3x8xf32>
    return %1 : tensor<3x8xf32>
  }
}
