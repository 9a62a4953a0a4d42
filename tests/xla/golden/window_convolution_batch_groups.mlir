module @window_convolution_batch_groups attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2x4x5xf32>, %arg1: tensor<2x6x3xf32>) -> (tensor<6x2x3xf32>) {
    %0 = "stablehlo.convolution"(%arg0, %arg1) {batch_group_count = 2 : i64, dimension_numbers = #stablehlo.conv<raw input_batch_dimension = 1, input_feature_dimension = 0, input_spatial_dimensions = [2], kernel_input_feature_dimension = 0, kernel_output_feature_dimension = 1, kernel_spatial_dimensions = [2], output_batch_dimension = 1, output_feature_dimension = 0, output_spatial_dimensions = [2]>, feature_group_count = 1 : i64, lhs_dilation = array<i64: 1>, padding = dense<[[1, 1]]> : tensor<1x2xi64>, rhs_dilation = array<i64: 2>, window_strides = array<i64: 1>} : (tensor<2x4x5xf32>, tensor<2x6x3xf32>) -> tensor<6x2x3xf32>
    return %0 : tensor<6x2x3xf32>
  }
}
