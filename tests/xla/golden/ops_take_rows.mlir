module @ops_take_rows attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<5x3xf32>, %arg1: tensor<2x2xi32>, %arg2: tensor<2x4x3xf32>, %arg3: tensor<3xi64>, %arg4: tensor<i32>) -> (tensor<2x2x3xf32>, tensor<2x3x3xf32>, tensor<3xf32>) {
    %0 = "stablehlo.gather"(%arg0, %arg1) {dimension_numbers = #stablehlo.gather<offset_dims = [2], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, 3>} : (tensor<5x3xf32>, tensor<2x2xi32>) -> tensor<2x2x3xf32>
    %1 = "stablehlo.gather"(%arg2, %arg3) {dimension_numbers = #stablehlo.gather<offset_dims = [0, 2], collapsed_slice_dims = [1], start_index_map = [1], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 2, 1, 3>} : (tensor<2x4x3xf32>, tensor<3xi64>) -> tensor<2x3x3xf32>
    %2 = "stablehlo.gather"(%arg0, %arg4) {dimension_numbers = #stablehlo.gather<offset_dims = [0], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 0>, indices_are_sorted = false, slice_sizes = array<i64: 1, 3>} : (tensor<5x3xf32>, tensor<i32>) -> tensor<3xf32>
    return %0, %1, %2 : tensor<2x2x3xf32>, tensor<2x3x3xf32>, tensor<3xf32>
  }
}
