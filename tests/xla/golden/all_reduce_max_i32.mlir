module @all_reduce_max_i32 attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 2 : i32} {
  func.func public @main(%arg0: tensor<3xi32>) -> (tensor<3xi32>) {
    %3 = "stablehlo.all_reduce"(%arg0) ({
      ^bb0(%0: tensor<i32>, %1: tensor<i32>):
        %2 = "stablehlo.maximum"(%0, %1) : (tensor<i32>, tensor<i32>) -> tensor<i32>
        "stablehlo.return"(%2) : (tensor<i32>) -> ()
    }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<3xi32>) -> tensor<3xi32>
    return %3 : tensor<3xi32>
  }
}
