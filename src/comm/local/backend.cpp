// The one-rank backend: every collective is the identity (all_gather and
// reduce_scatter copy input to output), so strategies run unchanged in a
// single process without a launcher or a store.
#include "strata/comm/local.h"

#include <ATen/ATen.h>

#include "strata/core/error.h"

namespace strata::comm::local {
namespace {

class LocalBackend final : public Backend {
 public:
  std::string name() const override { return "local"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds::max(); }

  void all_reduce(at::Tensor&, ReduceOp) override {}

  void all_gather(const at::Tensor& input, at::Tensor& output) override {
    copy_flat("all_gather", input, output);
  }

  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp) override {
    copy_flat("reduce_scatter", input, output);
  }

  void broadcast(at::Tensor&, int src) override {
    STRATA_CHECK(src == 0, ConfigError, "[local] broadcast from rank ", src, " in a group of one rank");
  }

  void barrier() override {}

 private:
  static void copy_flat(const char* op, const at::Tensor& input, at::Tensor& output) {
    STRATA_CHECK(input.numel() == output.numel(), ConfigError, "[local] ", op, ": output has ",
                 output.numel(), " elements, expected ", input.numel());
    if (input.data_ptr() != output.data_ptr()) output.view(-1).copy_(input.reshape(-1));
  }
};

}  // namespace

std::shared_ptr<Backend> create() { return std::make_shared<LocalBackend>(); }

}  // namespace strata::comm::local
