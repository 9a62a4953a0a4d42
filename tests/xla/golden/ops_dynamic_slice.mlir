module @ops_dynamic_slice attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<4x5xf32>, %arg1: tensor<2x2xf32>, %arg2: tensor<i32>, %arg3: tensor<i32>) -> (tensor<2x3xf32>, tensor<4x5xf32>) {
    %0 = "stablehlo.dynamic_slice"(%arg0, %arg2, %arg3) {slice_sizes = array<i64: 2, 3>} : (tensor<4x5xf32>, tensor<i32>, tensor<i32>) -> tensor<2x3xf32>
    %1 = "stablehlo.dynamic_update_slice"(%arg0, %arg1, %arg2, %arg3) : (tensor<4x5xf32>, tensor<2x2xf32>, tensor<i32>, tensor<i32>) -> tensor<4x5xf32>
    return %0, %1 : tensor<2x3xf32>, tensor<4x5xf32>
  }
}
