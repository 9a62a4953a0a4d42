module @softmax attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2x5xf32>) -> (tensor<2x5xf32>) {
    %0 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32>
    %1 = "stablehlo.constant"() {value = dense<0.0> : tensor<f32>} : () -> tensor<f32>
    %5 = "stablehlo.reduce"(%arg0, %0) ({
      ^bb0(%2: tensor<f32>, %3: tensor<f32>):
        %4 = "stablehlo.maximum"(%2, %3) : (tensor<f32>, tensor<f32>) -> tensor<f32>
        "stablehlo.return"(%4) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 1>} : (tensor<2x5xf32>, tensor<f32>) -> tensor<2xf32>
    %6 = "stablehlo.broadcast_in_dim"(%5) {broadcast_dimensions = array<i64: 0>} : (tensor<2xf32>) -> tensor<2x5xf32>
    %7 = "stablehlo.subtract"(%arg0, %6) : (tensor<2x5xf32>, tensor<2x5xf32>) -> tensor<2x5xf32>
    %8 = "stablehlo.exponential"(%7) : (tensor<2x5xf32>) -> tensor<2x5xf32>
    %12 = "stablehlo.reduce"(%8, %1) ({
      ^bb0(%9: tensor<f32>, %10: tensor<f32>):
        %11 = "stablehlo.add"(%9, %10) : (tensor<f32>, tensor<f32>) -> tensor<f32>
        "stablehlo.return"(%11) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 1>} : (tensor<2x5xf32>, tensor<f32>) -> tensor<2xf32>
    %13 = "stablehlo.broadcast_in_dim"(%12) {broadcast_dimensions = array<i64: 0>} : (tensor<2xf32>) -> tensor<2x5xf32>
    %14 = "stablehlo.divide"(%8, %13) : (tensor<2x5xf32>, tensor<2x5xf32>) -> tensor<2x5xf32>
    return %14 : tensor<2x5xf32>
  }
}
