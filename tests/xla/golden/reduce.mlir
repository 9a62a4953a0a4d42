module @reduce attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<3x4xf32>) -> (tensor<3xf32>, tensor<f32>) {
    %0 = "stablehlo.constant"() {value = dense<0.0> : tensor<f32>} : () -> tensor<f32>
    %1 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32>
    %5 = "stablehlo.reduce"(%arg0, %0) ({
      ^bb0(%2: tensor<f32>, %3: tensor<f32>):
        %4 = "stablehlo.add"(%2, %3) : (tensor<f32>, tensor<f32>) -> tensor<f32>
        "stablehlo.return"(%4) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 1>} : (tensor<3x4xf32>, tensor<f32>) -> tensor<3xf32>
    %9 = "stablehlo.reduce"(%arg0, %1) ({
      ^bb0(%6: tensor<f32>, %7: tensor<f32>):
        %8 = "stablehlo.maximum"(%6, %7) : (tensor<f32>, tensor<f32>) -> tensor<f32>
        "stablehlo.return"(%8) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 0, 1>} : (tensor<3x4xf32>, tensor<f32>) -> tensor<f32>
    return %5, %9 : tensor<3xf32>, tensor<f32>
  }
}
