module @donation attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<4xf32> {tf.aliasing_output = 0 : i32}, %arg1: tensor<4xf32> {jax.buffer_donor = true}, %arg2: tensor<f32>) -> (tensor<4xf32>, tensor<4xf32>) {
    %0 = "stablehlo.broadcast_in_dim"(%arg2) {broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<4xf32>
    %1 = "stablehlo.multiply"(%0, %arg1) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %2 = "stablehlo.subtract"(%arg0, %1) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %3:2 = "stablehlo.optimization_barrier"(%2, %arg1) : (tensor<4xf32>, tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
    %4 = "stablehlo.negate"(%3#1) : (tensor<4xf32>) -> tensor<4xf32>
    return %3#0, %4 : tensor<4xf32>, tensor<4xf32>
  }
}
