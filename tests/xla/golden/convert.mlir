module @convert attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<6xf32>) -> (tensor<6xi32>, tensor<6xbf16>, tensor<6xf64>) {
    %0 = "stablehlo.convert"(%arg0) : (tensor<6xf32>) -> tensor<6xi32>
    %1 = "stablehlo.convert"(%arg0) : (tensor<6xf32>) -> tensor<6xbf16>
    %2 = "stablehlo.convert"(%arg0) : (tensor<6xf32>) -> tensor<6xf64>
    return %0, %1, %2 : tensor<6xi32>, tensor<6xbf16>, tensor<6xf64>
  }
}
