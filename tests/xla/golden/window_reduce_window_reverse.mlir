module @window_reduce_window_reverse attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2x3x5x6xf32>) -> (tensor<2x3x3x4xf32>, tensor<2x3x2x2xf32>, tensor<2x3x8x10xf32>, tensor<2x3x5x6xf32>) {
    %0 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32>
    %1 = "stablehlo.constant"() {value = dense<0.0> : tensor<f32>} : () -> tensor<f32>
    %5 = "stablehlo.reduce_window"(%arg0, %0) ({
      ^bb0(%2: tensor<f32>, %3: tensor<f32>):
        %4 = "stablehlo.maximum"(%2, %3) : (tensor<f32>, tensor<f32>) -> tensor<f32>
        "stablehlo.return"(%4) : (tensor<f32>) -> ()
    }) {base_dilations = array<i64: 1, 1, 1, 1>, padding = dense<[[0, 0], [0, 0], [1, 1], [0, 0]]> : tensor<4x2xi64>, window_dilations = array<i64: 1, 1, 1, 2>, window_dimensions = array<i64: 1, 1, 3, 2>, window_strides = array<i64: 1, 1, 2, 1>} : (tensor<2x3x5x6xf32>, tensor<f32>) -> tensor<2x3x3x4xf32>
    %9 = "stablehlo.reduce_window"(%arg0, %1) ({
      ^bb0(%6: tensor<f32>, %7: tensor<f32>):
        %8 = "stablehlo.add"(%6, %7) : (tensor<f32>, tensor<f32>) -> tensor<f32>
        "stablehlo.return"(%8) : (tensor<f32>) -> ()
    }) {base_dilations = array<i64: 1, 1, 1, 1>, padding = dense<[[0, 0], [0, 0], [0, 0], [0, 0]]> : tensor<4x2xi64>, window_dilations = array<i64: 1, 1, 1, 1>, window_dimensions = array<i64: 1, 1, 2, 3>, window_strides = array<i64: 1, 1, 2, 3>} : (tensor<2x3x5x6xf32>, tensor<f32>) -> tensor<2x3x2x2xf32>
    %13 = "stablehlo.reduce_window"(%arg0, %1) ({
      ^bb0(%10: tensor<f32>, %11: tensor<f32>):
        %12 = "stablehlo.add"(%10, %11) : (tensor<f32>, tensor<f32>) -> tensor<f32>
        "stablehlo.return"(%12) : (tensor<f32>) -> ()
    }) {base_dilations = array<i64: 1, 1, 2, 2>, padding = dense<[[0, 0], [0, 0], [0, 0], [0, 0]]> : tensor<4x2xi64>, window_dilations = array<i64: 1, 1, 1, 1>, window_dimensions = array<i64: 1, 1, 2, 2>, window_strides = array<i64: 1, 1, 1, 1>} : (tensor<2x3x5x6xf32>, tensor<f32>) -> tensor<2x3x8x10xf32>
    %14 = "stablehlo.reverse"(%arg0) {dimensions = array<i64: 1, 3>} : (tensor<2x3x5x6xf32>) -> tensor<2x3x5x6xf32>
    return %5, %9, %13, %14 : tensor<2x3x3x4xf32>, tensor<2x3x2x2xf32>, tensor<2x3x8x10xf32>, tensor<2x3x5x6xf32>
  }
}
