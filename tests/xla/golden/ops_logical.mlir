module @ops_logical attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<4xi1>, %arg1: tensor<4xi1>, %arg2: tensor<4xi32>, %arg3: tensor<4xi32>) -> (tensor<4xi1>, tensor<4xi1>, tensor<4xi1>, tensor<4xi1>, tensor<4xi32>, tensor<4xi32>, tensor<4xi32>, tensor<4xi32>) {
    %0 = "stablehlo.and"(%arg0, %arg1) : (tensor<4xi1>, tensor<4xi1>) -> tensor<4xi1>
    %1 = "stablehlo.or"(%arg0, %arg1) : (tensor<4xi1>, tensor<4xi1>) -> tensor<4xi1>
    %2 = "stablehlo.xor"(%arg0, %arg1) : (tensor<4xi1>, tensor<4xi1>) -> tensor<4xi1>
    %3 = "stablehlo.not"(%arg0) : (tensor<4xi1>) -> tensor<4xi1>
    %4 = "stablehlo.and"(%arg2, %arg3) : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi32>
    %5 = "stablehlo.or"(%arg2, %arg3) : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi32>
    %6 = "stablehlo.constant"() {value = dense<1> : tensor<4xi32>} : () -> tensor<4xi32>
    %7 = "stablehlo.shift_right_logical"(%arg2, %6) : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi32>
    %8 = "stablehlo.remainder"(%arg2, %arg3) : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi32>
    return %0, %1, %2, %3, %4, %5, %7, %8 : tensor<4xi1>, tensor<4xi1>, tensor<4xi1>, tensor<4xi1>, tensor<4xi32>, tensor<4xi32>, tensor<4xi32>, tensor<4xi32>
  }
}
