// A two-layer perceptron with a softmax head: the program `make run`
// compiles with IREE and runs on the CPU.
func.func @main(%x: tensor<2x4xf32>, %w1: tensor<4x8xf32>, %b1: tensor<8xf32>,
                %w2: tensor<8x3xf32>) -> (tensor<2x3xf32>, tensor<2xi32>) {
  %h = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0]
      : (tensor<2x4xf32>, tensor<4x8xf32>) -> tensor<2x8xf32>
  %bb = stablehlo.broadcast_in_dim %b1, dims = [1] : (tensor<8xf32>) -> tensor<2x8xf32>
  %hb = stablehlo.add %h, %bb : tensor<2x8xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<2x8xf32>
  %relu = stablehlo.maximum %hb, %zero : tensor<2x8xf32>
  %logits = stablehlo.dot_general %relu, %w2, contracting_dims = [1] x [0]
      : (tensor<2x8xf32>, tensor<8x3xf32>) -> tensor<2x3xf32>
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %max = stablehlo.reduce(%logits init: %ninf) applies stablehlo.maximum
      across dimensions = [1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>
  %maxb = stablehlo.broadcast_in_dim %max, dims = [0] : (tensor<2xf32>) -> tensor<2x3xf32>
  %shift = stablehlo.subtract %logits, %maxb : tensor<2x3xf32>
  %exp = stablehlo.exponential %shift : tensor<2x3xf32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %sum = stablehlo.reduce(%exp init: %z) applies stablehlo.add
      across dimensions = [1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>
  %sumb = stablehlo.broadcast_in_dim %sum, dims = [0] : (tensor<2xf32>) -> tensor<2x3xf32>
  %probs = stablehlo.divide %exp, %sumb : tensor<2x3xf32>
  // argmax as the index of the max logit: compare against the row max,
  // select the iota index where equal, take the minimum such index.
  %iota = stablehlo.iota dim = 1 : tensor<2x3xi32>
  %eq = stablehlo.compare EQ, %logits, %maxb : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xi1>
  %big = stablehlo.constant dense<3> : tensor<2x3xi32>
  %cand = stablehlo.select %eq, %iota, %big : tensor<2x3xi1>, tensor<2x3xi32>
  %imax = stablehlo.constant dense<2147483647> : tensor<i32>
  %arg = stablehlo.reduce(%cand init: %imax) applies stablehlo.minimum
      across dimensions = [1] : (tensor<2x3xi32>, tensor<i32>) -> tensor<2xi32>
  return %probs, %arg : tensor<2x3xf32>, tensor<2xi32>
}
