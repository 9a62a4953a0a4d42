module @all_reduce attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 2 : i32} {
  func.func public @main(%arg0: tensor<4xf32>) -> (tensor<4xf32>) {
    %3 = "stablehlo.all_reduce"(%arg0) ({
      ^bb0(%0: tensor<f32>, %1: tensor<f32>):
        %2 = "stablehlo.add"(%0, %1) : (tensor<f32>, tensor<f32>) -> tensor<f32>
        "stablehlo.return"(%2) : (tensor<f32>) -> ()
    }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<4xf32>) -> tensor<4xf32>
    return %3 : tensor<4xf32>
  }
}
