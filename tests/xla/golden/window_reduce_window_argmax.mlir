module @window_reduce_window_argmax attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<1x1x4x5xf32>) -> (tensor<1x2x2x3xf32>, tensor<1x2x2x3xi64>) {
    %0 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<1x1x4x5xf32>} : () -> tensor<1x1x4x5xf32>
    %1 = "stablehlo.concatenate"(%arg0, %0) {dimension = 1 : i64} : (tensor<1x1x4x5xf32>, tensor<1x1x4x5xf32>) -> tensor<1x2x4x5xf32>
    %2 = "stablehlo.iota"() {iota_dimension = 0 : i64} : () -> tensor<20xi64>
    %3 = "stablehlo.reshape"(%2) : (tensor<20xi64>) -> tensor<4x5xi64>
    %4 = "stablehlo.broadcast_in_dim"(%3) {broadcast_dimensions = array<i64: 2, 3>} : (tensor<4x5xi64>) -> tensor<1x2x4x5xi64>
    %5 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32>
    %6 = "stablehlo.constant"() {value = dense<9223372036854774784> : tensor<i64>} : () -> tensor<i64>
    %25:2 = "stablehlo.reduce_window"(%1, %4, %5, %6) ({
      ^bb0(%7: tensor<f32>, %8: tensor<i64>, %9: tensor<f32>, %10: tensor<i64>):
        %11 = "stablehlo.compare"(%7, %7) {comparison_direction = #stablehlo<comparison_direction NE>} : (tensor<f32>, tensor<f32>) -> tensor<i1>
        %12 = "stablehlo.compare"(%9, %9) {comparison_direction = #stablehlo<comparison_direction NE>} : (tensor<f32>, tensor<f32>) -> tensor<i1>
        %13 = "stablehlo.not"(%12) : (tensor<i1>) -> tensor<i1>
        %14 = "stablehlo.and"(%11, %13) : (tensor<i1>, tensor<i1>) -> tensor<i1>
        %15 = "stablehlo.compare"(%7, %9) {comparison_direction = #stablehlo<comparison_direction GT>} : (tensor<f32>, tensor<f32>) -> tensor<i1>
        %16 = "stablehlo.or"(%15, %14) : (tensor<i1>, tensor<i1>) -> tensor<i1>
        %17 = "stablehlo.and"(%11, %12) : (tensor<i1>, tensor<i1>) -> tensor<i1>
        %18 = "stablehlo.compare"(%7, %9) {comparison_direction = #stablehlo<comparison_direction EQ>} : (tensor<f32>, tensor<f32>) -> tensor<i1>
        %19 = "stablehlo.or"(%18, %17) : (tensor<i1>, tensor<i1>) -> tensor<i1>
        %20 = "stablehlo.compare"(%8, %10) {comparison_direction = #stablehlo<comparison_direction LT>} : (tensor<i64>, tensor<i64>) -> tensor<i1>
        %21 = "stablehlo.and"(%19, %20) : (tensor<i1>, tensor<i1>) -> tensor<i1>
        %22 = "stablehlo.or"(%16, %21) : (tensor<i1>, tensor<i1>) -> tensor<i1>
        %23 = "stablehlo.select"(%22, %7, %9) : (tensor<i1>, tensor<f32>, tensor<f32>) -> tensor<f32>
        %24 = "stablehlo.select"(%22, %8, %10) : (tensor<i1>, tensor<i64>, tensor<i64>) -> tensor<i64>
        "stablehlo.return"(%23, %24) : (tensor<f32>, tensor<i64>) -> ()
    }) {base_dilations = array<i64: 1, 1, 1, 1>, padding = dense<[[0, 0], [0, 0], [1, 1], [1, 1]]> : tensor<4x2xi64>, window_dilations = array<i64: 1, 1, 1, 1>, window_dimensions = array<i64: 1, 1, 3, 3>, window_strides = array<i64: 1, 1, 2, 2>} : (tensor<1x2x4x5xf32>, tensor<1x2x4x5xi64>, tensor<f32>, tensor<i64>) -> (tensor<1x2x2x3xf32>, tensor<1x2x2x3xi64>)
    return %25#0, %25#1 : tensor<1x2x2x3xf32>, tensor<1x2x2x3xi64>
  }
}
