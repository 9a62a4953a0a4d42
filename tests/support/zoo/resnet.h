// A small ResNet written from torchvision's definition: BasicBlocks of two
// 3x3 convolutions with BatchNorm2d, a downsample Sequential (1x1
// convolution and BatchNorm2d) where the shape changes, the 7x7 stem with
// max pooling, adaptive average pooling and a linear classifier, with
// torchvision's initialisation. Stages are Sequentials `layer1`, `layer2`,
// ...; widths start at `width` and double per stage. Trained with
// cross-entropy.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "support/zoo/batch.h"

namespace zoo::resnet {

inline torch::nn::Conv2d conv3x3(int64_t in_planes, int64_t out_planes, int64_t stride = 1) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in_planes, out_planes, 3).stride(stride).padding(1).bias(false));
}

inline torch::nn::Conv2d conv1x1(int64_t in_planes, int64_t out_planes, int64_t stride = 1) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in_planes, out_planes, 1).stride(stride).bias(false));
}

struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(int64_t inplanes, int64_t planes, int64_t stride = 1,
                 torch::nn::Sequential downsample = torch::nn::Sequential(nullptr))
      : conv1(conv3x3(inplanes, planes, stride)),
        bn1(planes),
        conv2(conv3x3(planes, planes)),
        bn2(planes),
        downsample(std::move(downsample)) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    if (!this->downsample.is_empty()) register_module("downsample", this->downsample);
  }

  torch::Tensor forward(torch::Tensor x) {
    auto identity = x;
    auto out = torch::relu(bn1->forward(conv1->forward(x)));
    out = bn2->forward(conv2->forward(out));
    if (!downsample.is_empty()) identity = downsample->forward(x);
    out += identity;
    return torch::relu(out);
  }

  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Sequential downsample;
};
TORCH_MODULE(BasicBlock);

struct ResNetImpl : torch::nn::Module {
  /// `layers[i]` BasicBlocks in stage i+1 (width `width * 2^i`, stride 2
  /// from the second stage on), `num_classes` outputs, `in_channels` input
  /// planes.
  ResNetImpl(std::vector<int64_t> layers, int64_t num_classes = 10, int64_t width = 8, int64_t in_channels = 3)
      : inplanes(width),
        conv1(torch::nn::Conv2dOptions(in_channels, width, 7).stride(2).padding(3).bias(false)),
        bn1(width),
        maxpool(torch::nn::MaxPool2dOptions(3).stride(2).padding(1)),
        avgpool(torch::nn::AdaptiveAvgPool2dOptions({1, 1})),
        fc(nullptr) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("maxpool", maxpool);
    int64_t planes = width;
    for (size_t i = 0; i < layers.size(); ++i) {
      stages.push_back(register_module("layer" + std::to_string(i + 1),
                                        make_layer(planes, layers[i], i == 0 ? 1 : 2)));
      planes *= 2;
    }
    register_module("avgpool", avgpool);
    fc = register_module("fc", torch::nn::Linear(inplanes, num_classes));

    for (auto& module : modules(/*include_self=*/false)) {
      if (auto* conv = module->as<torch::nn::Conv2d>()) {
        torch::nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
      } else if (auto* bn = module->as<torch::nn::BatchNorm2d>()) {
        torch::nn::init::constant_(bn->weight, 1);
        torch::nn::init::constant_(bn->bias, 0);
      }
    }
  }

  torch::nn::Sequential make_layer(int64_t planes, int64_t blocks, int64_t stride) {
    torch::nn::Sequential downsample(nullptr);
    if (stride != 1 || inplanes != planes) {
      downsample = torch::nn::Sequential(conv1x1(inplanes, planes, stride), torch::nn::BatchNorm2d(planes));
    }
    torch::nn::Sequential layer;
    layer->push_back(BasicBlock(inplanes, planes, stride, downsample));
    inplanes = planes;
    for (int64_t i = 1; i < blocks; ++i) layer->push_back(BasicBlock(inplanes, planes));
    return layer;
  }

  /// Class scores (N, num_classes) of images (N, C, H, W).
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn1->forward(conv1->forward(x)));
    x = maxpool->forward(x);
    for (auto& stage : stages) x = stage->forward(x);
    x = avgpool->forward(x);
    x = torch::flatten(x, 1);
    return fc->forward(x);
  }

  int64_t inplanes;
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::MaxPool2d maxpool;
  std::vector<torch::nn::Sequential> stages;
  torch::nn::AdaptiveAvgPool2d avgpool;
  torch::nn::Linear fc;
};
TORCH_MODULE(ResNet);

/// Parameters of ResNet(layers, classes, width, in_channels).
inline int64_t parameter_count(const std::vector<int64_t>& layers, int64_t classes = 10, int64_t width = 8,
                               int64_t in_channels = 3) {
  int64_t n = in_channels * width * 49 + 2 * width;
  int64_t inplanes = width, planes = width;
  for (size_t i = 0; i < layers.size(); ++i) {
    for (int64_t b = 0; b < layers[i]; ++b) {
      n += inplanes * planes * 9 + planes * planes * 9 + 4 * planes;
      if (b == 0 && (i > 0 || inplanes != planes)) n += inplanes * planes + 2 * planes;
      inplanes = planes;
    }
    planes *= 2;
  }
  return n + inplanes * classes + classes;
}

/// `n` images (n, 3, size, size) and their classes (n).
inline std::pair<torch::Tensor, torch::Tensor> batch(int64_t n = 4, int64_t size = 16, int64_t classes = 10,
                                                     uint64_t seed = 4) {
  auto gen = batch_generator(seed);
  auto images = normal({n, 3, size, size}, gen);
  return {images, labels(classes, {n}, gen)};
}

/// Cross-entropy of class scores.
inline torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits, targets);
}

}  // namespace zoo::resnet
