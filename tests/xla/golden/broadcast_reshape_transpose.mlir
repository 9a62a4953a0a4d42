module @broadcast_reshape_transpose attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<3xf32>, %arg1: tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<3x2xf32>, tensor<3x2xf32>) {
    %0 = "stablehlo.broadcast_in_dim"(%arg0) {broadcast_dimensions = array<i64: 1>} : (tensor<3xf32>) -> tensor<2x3xf32>
    %1 = "stablehlo.add"(%0, %arg1) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    %2 = "stablehlo.reshape"(%arg1) : (tensor<2x3xf32>) -> tensor<3x2xf32>
    %3 = "stablehlo.transpose"(%arg1) {permutation = array<i64: 1, 0>} : (tensor<2x3xf32>) -> tensor<3x2xf32>
    return %1, %2, %3 : tensor<2x3xf32>, tensor<3x2xf32>, tensor<3x2xf32>
  }
}
