module @compare_select attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2x3xf32>) -> (tensor<2x3xi1>, tensor<2x3xf32>) {
    %0 = "stablehlo.constant"() {value = dense<0.0> : tensor<2x3xf32>} : () -> tensor<2x3xf32>
    %1 = "stablehlo.compare"(%arg0, %0) {comparison_direction = #stablehlo<comparison_direction GT>} : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xi1>
    %2 = "stablehlo.select"(%1, %arg0, %0) : (tensor<2x3xi1>, tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    return %1, %2 : tensor<2x3xi1>, tensor<2x3xf32>
  }
}
