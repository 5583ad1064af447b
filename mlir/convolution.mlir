// RUN: alpa-pass-opt %s --extract
// NHWC x HWIO -> NHWC convolution. CONVOLUTION attrs: in_batch, in_feature, ns, in_spatial*ns,
// k_in_feature, k_out_feature, k_spatial*ns, out_batch, out_feature, out_spatial*ns,
// feature_group_count, batch_group_count.

// CHECK: %0 = parameter parameter [2,8,8,3]:2B () [0]
// CHECK-NEXT: %1 = parameter parameter [3,3,3,16]:2B () [1]
// CHECK-NEXT: %2 = convolution stablehlo.convolution [2,8,8,16]:2B (%0, %1) [0,3,2,1,2,2,3,0,1,0,3,1,2,1,1] convolution
// CHECK-NEXT: %3 = elementwise stablehlo.convert [2,8,8,16]:4B (%2) []
module @jit_conv {
  func.func public @main(%arg0: tensor<2x8x8x3xbf16>, %arg1: tensor<3x3x3x16xbf16>) -> (tensor<2x8x8x16xf32> {jax.result_info = "result"}) {
    %0 = stablehlo.convolution(%arg0, %arg1) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64, precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]} : (tensor<2x8x8x3xbf16>, tensor<3x3x3x16xbf16>) -> tensor<2x8x8x16xbf16>
    %1 = stablehlo.convert %0 : (tensor<2x8x8x16xbf16>) -> tensor<2x8x8x16xf32>
    return %1 : tensor<2x8x8x16xf32>
  }
}
