module @ops_iota_slice_concatenate_pad attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<3x4xf32>) -> (tensor<2x3xi32>, tensor<2x3xf32>, tensor<2x2xf32>, tensor<1x4xf32>, tensor<3x5xf32>, tensor<6x4xf32>, tensor<6x5xf32>) {
    %0 = "stablehlo.iota"() {iota_dimension = 1 : i64} : () -> tensor<2x3xi32>
    %1 = "stablehlo.iota"() {iota_dimension = 0 : i64} : () -> tensor<2x3xf32>
    %2 = "stablehlo.slice"(%arg0) {limit_indices = array<i64: 3, 4>, start_indices = array<i64: 0, 1>, strides = array<i64: 2, 2>} : (tensor<3x4xf32>) -> tensor<2x2xf32>
    %3 = "stablehlo.slice"(%arg0) {limit_indices = array<i64: 2, 4>, start_indices = array<i64: 1, 0>, strides = array<i64: 1, 1>} : (tensor<3x4xf32>) -> tensor<1x4xf32>
    %4 = "stablehlo.slice"(%arg0) {limit_indices = array<i64: 3, 1>, start_indices = array<i64: 0, 0>, strides = array<i64: 1, 1>} : (tensor<3x4xf32>) -> tensor<3x1xf32>
    %5 = "stablehlo.concatenate"(%arg0, %4) {dimension = 1 : i64} : (tensor<3x4xf32>, tensor<3x1xf32>) -> tensor<3x5xf32>
    %6 = "stablehlo.concatenate"(%arg0, %arg0) {dimension = 0 : i64} : (tensor<3x4xf32>, tensor<3x4xf32>) -> tensor<6x4xf32>
    %7 = "stablehlo.constant"() {value = dense<0.5> : tensor<f32>} : () -> tensor<f32>
    %8 = "stablehlo.pad"(%arg0, %7) {edge_padding_high = array<i64: 0, 2>, edge_padding_low = array<i64: 1, -1>, interior_padding = array<i64: 1, 0>} : (tensor<3x4xf32>, tensor<f32>) -> tensor<6x5xf32>
    return %0, %1, %2, %3, %5, %6, %8 : tensor<2x3xi32>, tensor<2x3xf32>, tensor<2x2xf32>, tensor<1x4xf32>, tensor<3x5xf32>, tensor<6x4xf32>, tensor<6x5xf32>
  }
}
