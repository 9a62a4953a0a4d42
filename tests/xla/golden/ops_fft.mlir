module @ops_fft attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<3x8xf32>, %arg1: tensor<3x8xf32>) -> (tensor<3x5xf32>, tensor<3x5xf32>, tensor<3x8xf32>, tensor<3x8xf32>, tensor<3x8xf32>, tensor<3x8xf32>, tensor<3x8xf32>) {
    %0 = "stablehlo.fft"(%arg0) {fft_type = #stablehlo<fft_type RFFT>, fft_length = array<i64: 8>} : (tensor<3x8xf32>) -> tensor<3x5xcomplex<f32>>
    %1 = "stablehlo.complex"(%arg0, %arg1) : (tensor<3x8xf32>, tensor<3x8xf32>) -> tensor<3x8xcomplex<f32>>
    %2 = "stablehlo.fft"(%1) {fft_type = #stablehlo<fft_type FFT>, fft_length = array<i64: 3, 8>} : (tensor<3x8xcomplex<f32>>) -> tensor<3x8xcomplex<f32>>
    %3 = "stablehlo.fft"(%1) {fft_type = #stablehlo<fft_type IFFT>, fft_length = array<i64: 8>} : (tensor<3x8xcomplex<f32>>) -> tensor<3x8xcomplex<f32>>
    %4 = "stablehlo.real"(%0) : (tensor<3x5xcomplex<f32>>) -> tensor<3x5xf32>
    %5 = "stablehlo.imag"(%0) : (tensor<3x5xcomplex<f32>>) -> tensor<3x5xf32>
    %6 = "stablehlo.real"(%2) : (tensor<3x8xcomplex<f32>>) -> tensor<3x8xf32>
    %7 = "stablehlo.imag"(%2) : (tensor<3x8xcomplex<f32>>) -> tensor<3x8xf32>
    %8 = "stablehlo.real"(%3) : (tensor<3x8xcomplex<f32>>) -> tensor<3x8xf32>
    %9 = "stablehlo.imag"(%3) : (tensor<3x8xcomplex<f32>>) -> tensor<3x8xf32>
    %10 = "stablehlo.fft"(%0) {fft_type = #stablehlo<fft_type IRFFT>, fft_length = array<i64: 8>} : (tensor<3x5xcomplex<f32>>) -> tensor<3x8xf32>
    return %4, %5, %6, %7, %8, %9, %10 : tensor<3x5xf32>, tensor<3x5xf32>, tensor<3x8xf32>, tensor<3x8xf32>, tensor<3x8xf32>, tensor<3x8xf32>, tensor<3x8xf32>
  }
}
