module @ops_barrier_argmax attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<3x5xf32>, %arg1: tensor<2xi32>) -> (tensor<3x5xf32>, tensor<2xi32>, tensor<3xf32>, tensor<3xi64>, tensor<5xi32>, tensor<5xi32>) {
    %0:2 = "stablehlo.optimization_barrier"(%arg0, %arg1) : (tensor<3x5xf32>, tensor<2xi32>) -> (tensor<3x5xf32>, tensor<2xi32>)
    %1 = "stablehlo.constant"() {value = dense<[[0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0x7FC00000, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]]> : tensor<3x5xf32>} : () -> tensor<3x5xf32>
    %2 = "stablehlo.add"(%0#0, %1) : (tensor<3x5xf32>, tensor<3x5xf32>) -> tensor<3x5xf32>
    %3 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32>
    %4 = "stablehlo.constant"() {value = dense<0> : tensor<i64>} : () -> tensor<i64>
    %5 = "stablehlo.iota"() {iota_dimension = 1 : i64} : () -> tensor<3x5xi64>
    %24:2 = "stablehlo.reduce"(%2, %5, %3, %4) ({
      ^bb0(%6: tensor<f32>, %7: tensor<i64>, %8: tensor<f32>, %9: tensor<i64>):
        %10 = "stablehlo.compare"(%6, %8) {comparison_direction = #stablehlo<comparison_direction GT>} : (tensor<f32>, tensor<f32>) -> tensor<i1>
        %11 = "stablehlo.compare"(%6, %8) {comparison_direction = #stablehlo<comparison_direction EQ>} : (tensor<f32>, tensor<f32>) -> tensor<i1>
        %12 = "stablehlo.compare"(%6, %6) {comparison_direction = #stablehlo<comparison_direction NE>} : (tensor<f32>, tensor<f32>) -> tensor<i1>
        %13 = "stablehlo.compare"(%8, %8) {comparison_direction = #stablehlo<comparison_direction NE>} : (tensor<f32>, tensor<f32>) -> tensor<i1>
        %14 = "stablehlo.not"(%13) : (tensor<i1>) -> tensor<i1>
        %15 = "stablehlo.and"(%12, %14) : (tensor<i1>, tensor<i1>) -> tensor<i1>
        %16 = "stablehlo.or"(%10, %15) : (tensor<i1>, tensor<i1>) -> tensor<i1>
        %17 = "stablehlo.and"(%12, %13) : (tensor<i1>, tensor<i1>) -> tensor<i1>
        %18 = "stablehlo.or"(%11, %17) : (tensor<i1>, tensor<i1>) -> tensor<i1>
        %19 = "stablehlo.compare"(%7, %9) {comparison_direction = #stablehlo<comparison_direction LT>} : (tensor<i64>, tensor<i64>) -> tensor<i1>
        %20 = "stablehlo.and"(%18, %19) : (tensor<i1>, tensor<i1>) -> tensor<i1>
        %21 = "stablehlo.or"(%16, %20) : (tensor<i1>, tensor<i1>) -> tensor<i1>
        %22 = "stablehlo.select"(%21, %6, %8) : (tensor<i1>, tensor<f32>, tensor<f32>) -> tensor<f32>
        %23 = "stablehlo.select"(%21, %7, %9) : (tensor<i1>, tensor<i64>, tensor<i64>) -> tensor<i64>
        "stablehlo.return"(%22, %23) : (tensor<f32>, tensor<i64>) -> ()
    }) {dimensions = array<i64: 1>} : (tensor<3x5xf32>, tensor<3x5xi64>, tensor<f32>, tensor<i64>) -> (tensor<3xf32>, tensor<3xi64>)
    %25 = "stablehlo.convert"(%0#0) : (tensor<3x5xf32>) -> tensor<3x5xi32>
    %26 = "stablehlo.constant"() {value = dense<-2147483648> : tensor<i32>} : () -> tensor<i32>
    %27 = "stablehlo.constant"() {value = dense<0> : tensor<i32>} : () -> tensor<i32>
    %28 = "stablehlo.iota"() {iota_dimension = 0 : i64} : () -> tensor<3x5xi32>
    %40:2 = "stablehlo.reduce"(%25, %28, %26, %27) ({
      ^bb0(%29: tensor<i32>, %30: tensor<i32>, %31: tensor<i32>, %32: tensor<i32>):
        %33 = "stablehlo.compare"(%29, %31) {comparison_direction = #stablehlo<comparison_direction GT>} : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %34 = "stablehlo.compare"(%29, %31) {comparison_direction = #stablehlo<comparison_direction EQ>} : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %35 = "stablehlo.compare"(%30, %32) {comparison_direction = #stablehlo<comparison_direction LT>} : (tensor<i32>, tensor<i32>) -> tensor<i1>
        %36 = "stablehlo.and"(%34, %35) : (tensor<i1>, tensor<i1>) -> tensor<i1>
        %37 = "stablehlo.or"(%33, %36) : (tensor<i1>, tensor<i1>) -> tensor<i1>
        %38 = "stablehlo.select"(%37, %29, %31) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
        %39 = "stablehlo.select"(%37, %30, %32) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
        "stablehlo.return"(%38, %39) : (tensor<i32>, tensor<i32>) -> ()
    }) {dimensions = array<i64: 0>} : (tensor<3x5xi32>, tensor<3x5xi32>, tensor<i32>, tensor<i32>) -> (tensor<5xi32>, tensor<5xi32>)
    return %0#0, %0#1, %24#0, %24#1, %40#0, %40#1 : tensor<3x5xf32>, tensor<2xi32>, tensor<3xf32>, tensor<3xi64>, tensor<5xi32>, tensor<5xi32>
  }
}
