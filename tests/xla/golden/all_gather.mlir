module @all_gather attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 2 : i32} {
  func.func public @main(%arg0: tensor<2x3xf32>) -> (tensor<4x3xf32>) {
    %0 = "stablehlo.all_gather"(%arg0) {all_gather_dim = 0 : i64, replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<2x3xf32>) -> tensor<4x3xf32>
    return %0 : tensor<4x3xf32>
  }
}
