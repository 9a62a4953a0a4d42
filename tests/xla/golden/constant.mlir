module @constant attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<3xf32>) -> (tensor<2x3xf32>, tensor<3xf32>, tensor<2x2xi32>, tensor<3xi1>) {
    %0 = "stablehlo.constant"() {value = dense<[[1.5, -0.25, 1.0e+20], [0xFF800000, 0.0, 3.0]]> : tensor<2x3xf32>} : () -> tensor<2x3xf32>
    %1 = "stablehlo.constant"() {value = dense<0.5> : tensor<3xf32>} : () -> tensor<3xf32>
    %2 = "stablehlo.constant"() {value = dense<[[1, -2], [3, 2147483647]]> : tensor<2x2xi32>} : () -> tensor<2x2xi32>
    %3 = "stablehlo.constant"() {value = dense<[true, false, true]> : tensor<3xi1>} : () -> tensor<3xi1>
    %4 = "stablehlo.add"(%arg0, %1) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
    return %0, %4, %2, %3 : tensor<2x3xf32>, tensor<3xf32>, tensor<2x2xi32>, tensor<3xi1>
  }
}
