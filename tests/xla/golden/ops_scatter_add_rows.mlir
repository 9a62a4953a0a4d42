module @ops_scatter_add_rows attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2x3xi32>, %arg1: tensor<2x3x4xf32>, %arg2: tensor<2x3xf32>, %arg3: tensor<4xi64>, %arg4: tensor<2x4xf32>) -> (tensor<5x4xf32>, tensor<2x3xf32>) {
    %0 = "stablehlo.constant"() {value = dense<0.0> : tensor<5x4xf32>} : () -> tensor<5x4xf32>
    %4 = "stablehlo.scatter"(%0, %arg0, %arg1) ({
      ^bb0(%1: tensor<f32>, %2: tensor<f32>):
        %3 = "stablehlo.add"(%1, %2) : (tensor<f32>, tensor<f32>) -> tensor<f32>
        "stablehlo.return"(%3) : (tensor<f32>) -> ()
    }) {indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [2], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 2>, unique_indices = false} : (tensor<5x4xf32>, tensor<2x3xi32>, tensor<2x3x4xf32>) -> tensor<5x4xf32>
    %8 = "stablehlo.scatter"(%arg2, %arg3, %arg4) ({
      ^bb0(%5: tensor<f32>, %6: tensor<f32>):
        %7 = "stablehlo.add"(%5, %6) : (tensor<f32>, tensor<f32>) -> tensor<f32>
        "stablehlo.return"(%7) : (tensor<f32>) -> ()
    }) {indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [0], inserted_window_dims = [1], scatter_dims_to_operand_dims = [1], index_vector_dim = 1>, unique_indices = false} : (tensor<2x3xf32>, tensor<4xi64>, tensor<2x4xf32>) -> tensor<2x3xf32>
    return %4, %8 : tensor<5x4xf32>, tensor<2x3xf32>
  }
}
