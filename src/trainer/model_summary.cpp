// ModelSummary (trainer/model_summary.h): Lightning's table, counted from
// a LibTorch module.
#include "strata/trainer/model_summary.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_set>

namespace strata::trainer {
namespace {

// "strata::models::GPTImpl" -> "GPT", as Python's __class__.__name__.
std::string type_name(const torch::nn::Module& module) {
  std::string name = module.name();
  const size_t colon = name.rfind("::");
  if (colon != std::string::npos) name = name.substr(colon + 2);
  const size_t angle = name.find('<');  // a template's arguments
  if (angle != std::string::npos) name = name.substr(0, angle);
  if (name.size() > 4 && name.compare(name.size() - 4, 4, "Impl") == 0) name.resize(name.size() - 4);
  return name;
}

// Parameters of `module` and its children, each tensor once (Python's
// parameters() skips a tensor registered twice, as a tied head).
void count(const torch::nn::Module& module, int64_t& total, int64_t& trainable) {
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const at::Tensor& p : module.parameters(/*recurse=*/true)) {
    if (!p.defined() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
    total += p.numel();
    if (p.requires_grad()) trainable += p.numel();
  }
}

// Python's "{:,d}" for a non-negative integer.
std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n);
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) digits.insert(static_cast<size_t>(i), ",");
  return digits;
}

// Python's "{:,.Nf}" for a non-negative number.
std::string fixed_with_commas(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  std::string text = buf;
  const size_t point = text.find('.');
  const std::string whole = text.substr(0, point);
  std::string out = whole;
  for (int i = static_cast<int>(whole.size()) - 3; i > 0; i -= 3) out.insert(static_cast<size_t>(i), ",");
  return point == std::string::npos ? out : out + text.substr(point);
}

std::string pad(const std::string& text, size_t width) {
  return text.size() >= width ? text : text + std::string(width - text.size(), ' ');
}

int bytes_per_parameter(const std::string& precision) {
  if (precision == "64" || precision == "64-true") return 8;
  if (precision == "16" || precision == "bf16" || precision == "16-true" || precision == "bf16-true") return 2;
  return 4;
}

}  // namespace

std::string human_readable_count(int64_t number) {
  static const char* const kLabels[] = {" ", "K", "M", "B", "T"};
  if (number < 0) number = 0;
  const int digits = number > 0 ? static_cast<int>(std::floor(std::log10(static_cast<double>(number)))) + 1 : 1;
  const int groups = std::min((digits + 2) / 3, 5);
  const double scaled = static_cast<double>(number) * std::pow(10.0, -3 * (groups - 1));
  const int index = groups - 1;
  if (index < 1 || scaled >= 100) return with_commas(static_cast<int64_t>(scaled)) + " " + kLabels[index];
  return fixed_with_commas(scaled, 1) + " " + kLabels[index];
}

ModelSummary summarize(const torch::nn::Module& module, const std::string& precision) {
  ModelSummary s;
  count(module, s.total_parameters, s.trainable_parameters);
  int64_t in_layers = 0;
  for (const auto& item : module.named_children()) {
    LayerSummary layer;
    layer.name = item.key();
    layer.type = type_name(*item.value());
    layer.training = item.value()->is_training();
    count(*item.value(), layer.parameters, layer.trainable);
    in_layers += layer.parameters;
    s.layers.push_back(std::move(layer));
  }
  s.leftover_parameters = std::max<int64_t>(0, s.total_parameters - in_layers);
  s.size_mb = static_cast<double>(s.total_parameters) * bytes_per_parameter(precision) * 1e-6;
  std::unordered_set<const torch::nn::Module*> seen;
  for (const auto& m : module.modules(/*include_self=*/false)) {
    if (!seen.insert(m.get()).second) continue;
    (m->is_training() ? s.modules_in_train : s.modules_in_eval) += 1;
  }
  return s;
}

std::string ModelSummary::table() const {
  // Lightning's columns, FLOPs aside (docs/trainer.md says why).
  std::vector<std::pair<std::string, std::vector<std::string>>> cols = {
      {" ", {}}, {"Name", {}}, {"Type", {}}, {"Params", {}}, {"Mode", {}}};
  for (size_t i = 0; i < layers.size(); ++i) {
    cols[0].second.push_back(std::to_string(i));
    cols[1].second.push_back(layers[i].name);
    cols[2].second.push_back(layers[i].type);
    cols[3].second.push_back(human_readable_count(layers[i].parameters));
    cols[4].second.push_back(layers[i].training ? "train" : "eval");
  }
  if (leftover_parameters > 0) {
    for (auto& [header, cells] : cols) cells.push_back("n/a");
    cols[0].second.back() = " ";
    cols[1].second.back() = "other params";
    cols[3].second.back() = human_readable_count(leftover_parameters);
  }
  std::vector<size_t> widths;
  size_t total_width = 3 * (cols.size() + 1);
  for (const auto& [header, cells] : cols) {
    size_t w = header.size();
    for (const auto& c : cells) w = std::max(w, c.size());
    widths.push_back(w);
    total_width += w;
  }
  auto row = [&](auto cell) {
    std::string line;
    for (size_t c = 0; c < cols.size(); ++c) line += (c ? " | " : "") + pad(cell(c), widths[c]);
    return line;
  };
  std::string out = row([&](size_t c) { return cols[c].first; });
  const std::string rule(total_width, '-');
  out += "\n" + rule;
  for (size_t r = 0; r < cols[0].second.size(); ++r) out += "\n" + row([&](size_t c) { return cols[c].second[r]; });
  out += "\n" + rule;
  out += "\n" + pad(human_readable_count(trainable_parameters), 10) + "Trainable params";
  out += "\n" + pad(human_readable_count(total_parameters - trainable_parameters), 10) + "Non-trainable params";
  out += "\n" + pad(human_readable_count(total_parameters), 10) + "Total params";
  out += "\n" + pad(fixed_with_commas(size_mb, 3), 10) + "Total estimated model params size (MB)";
  out += "\n" + pad(std::to_string(modules_in_train), 10) + "Modules in train mode";
  out += "\n" + pad(std::to_string(modules_in_eval), 10) + "Modules in eval mode";
  return out;
}

}  // namespace strata::trainer
