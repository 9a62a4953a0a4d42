module @unary attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2x3xf32>, %arg1: tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>) {
    %0 = "stablehlo.negate"(%arg0) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    %1 = "stablehlo.exponential"(%arg0) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    %2 = "stablehlo.log"(%arg1) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    %3 = "stablehlo.sqrt"(%arg1) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    %4 = "stablehlo.rsqrt"(%arg1) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    %5 = "stablehlo.tanh"(%arg0) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    %6 = "stablehlo.abs"(%arg0) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    return %0, %1, %2, %3, %4, %5, %6 : tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>
  }
}
