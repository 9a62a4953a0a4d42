module @rng attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2xui64>, %arg1: tensor<64x64xf32>) -> (tensor<2xui64>, tensor<8xui32>, tensor<64x64xf32>, tensor<64x64xf32>) {
    %0:2 = "stablehlo.rng_bit_generator"(%arg0) {rng_algorithm = #stablehlo<rng_algorithm THREE_FRY>} : (tensor<2xui64>) -> (tensor<2xui64>, tensor<8xui32>)
    %1:2 = "stablehlo.rng_bit_generator"(%arg0) {rng_algorithm = #stablehlo<rng_algorithm THREE_FRY>} : (tensor<2xui64>) -> (tensor<2xui64>, tensor<64x64xui32>)
    %2 = "stablehlo.constant"() {value = dense<9> : tensor<64x64xui32>} : () -> tensor<64x64xui32>
    %3 = "stablehlo.shift_right_logical"(%1#1, %2) : (tensor<64x64xui32>, tensor<64x64xui32>) -> tensor<64x64xui32>
    %4 = "stablehlo.constant"() {value = dense<1065353216> : tensor<64x64xui32>} : () -> tensor<64x64xui32>
    %5 = "stablehlo.or"(%3, %4) : (tensor<64x64xui32>, tensor<64x64xui32>) -> tensor<64x64xui32>
    %6 = "stablehlo.bitcast_convert"(%5) : (tensor<64x64xui32>) -> tensor<64x64xf32>
    %7 = "stablehlo.constant"() {value = dense<1.0> : tensor<64x64xf32>} : () -> tensor<64x64xf32>
    %8 = "stablehlo.subtract"(%6, %7) : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
    %9 = "stablehlo.constant"() {value = dense<0.25> : tensor<64x64xf32>} : () -> tensor<64x64xf32>
    %10 = "stablehlo.compare"(%8, %9) {comparison_direction = #stablehlo<comparison_direction GE>} : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xi1>
    %11 = "stablehlo.constant"() {value = dense<1.33333333> : tensor<64x64xf32>} : () -> tensor<64x64xf32>
    %12 = "stablehlo.multiply"(%arg1, %11) : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
    %13 = "stablehlo.constant"() {value = dense<0.0> : tensor<64x64xf32>} : () -> tensor<64x64xf32>
    %14 = "stablehlo.select"(%10, %12, %13) : (tensor<64x64xi1>, tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
    return %0#0, %0#1, %8, %14 : tensor<2xui64>, tensor<8xui32>, tensor<64x64xf32>, tensor<64x64xf32>
  }
}
