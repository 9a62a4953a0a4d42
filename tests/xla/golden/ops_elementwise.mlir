module @ops_elementwise attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2x3xf32>, %arg1: tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xi1>, tensor<2x3xi1>, tensor<2x3xf32>, tensor<2x3xf32>) {
    %0 = "stablehlo.constant"() {value = dense<0.0> : tensor<2x3xf32>} : () -> tensor<2x3xf32>
    %1 = "stablehlo.divide"(%arg0, %0) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    %2 = "stablehlo.power"(%arg1, %arg0) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    %3 = "stablehlo.remainder"(%arg0, %arg1) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    %4 = "stablehlo.sign"(%arg0) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    %5 = "stablehlo.floor"(%arg0) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    %6 = "stablehlo.ceil"(%arg0) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    %7 = "stablehlo.round_nearest_even"(%arg0) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    %8 = "stablehlo.logistic"(%arg0) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    %9 = "stablehlo.log_plus_one"(%arg1) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    %10 = "stablehlo.exponential_minus_one"(%arg0) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    %11 = "chlo.erf"(%arg0) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    %12 = "stablehlo.constant"() {value = dense<1.25> : tensor<f32>} : () -> tensor<f32>
    %13 = "stablehlo.constant"() {value = dense<-1.0> : tensor<f32>} : () -> tensor<f32>
    %14 = "stablehlo.clamp"(%13, %arg0, %12) : (tensor<f32>, tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
    %15 = "stablehlo.is_finite"(%1) : (tensor<2x3xf32>) -> tensor<2x3xi1>
    %16 = "stablehlo.is_finite"(%arg0) : (tensor<2x3xf32>) -> tensor<2x3xi1>
    %17 = "stablehlo.sine"(%arg0) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    %18 = "stablehlo.cosine"(%arg0) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    return %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %14, %15, %16, %17, %18 : tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xi1>, tensor<2x3xi1>, tensor<2x3xf32>, tensor<2x3xf32>
  }
}
