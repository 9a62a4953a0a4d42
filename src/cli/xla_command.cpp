// `strata xla-probe`: can strata reach an XLA device through a PJRT plugin?
//   strata xla-probe [--plugin PATH] [--option NAME=VALUE]... [--out FILE]
// Loads the plugin (--plugin or STRATA_PJRT_PLUGIN), prints one JSON object
// with its PJRT C API version, attributes, platform and devices, then
// compiles and runs an add, a matmul and a 2-replica all-reduce (where the
// client has two devices) and compares each result with LibTorch on the
// host. Exit status 0 when every case that ran matched. The work is
// strata::xla::run_probe (LibTorch-free); this file adds the LibTorch
// reference and the flags.
#include <ATen/ATen.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "strata/core/error.h"
#include "strata/xla/client.h"
#include "strata/xla/probe.h"

namespace strata::cli {
namespace {

struct XlaProbeConfig {
  std::string plugin;
  std::vector<std::string> options;
  std::string out;
};

at::Tensor as_tensor(const std::vector<float>& values, const std::vector<int64_t>& dims) {
  return at::tensor(values, at::kFloat).reshape(dims);
}

std::vector<float> as_vector(const at::Tensor& t) {
  const at::Tensor flat = t.contiguous().reshape({-1});
  return std::vector<float>(flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel());
}

// The probe's expected outputs, computed by LibTorch on the CPU.
std::vector<std::vector<float>> libtorch_reference(const xla::ProbeCase& c) {
  if (c.name == "add")
    return {
        as_vector(as_tensor(c.inputs[0][0], c.input_dims[0]) + as_tensor(c.inputs[0][1], c.input_dims[1]))};
  if (c.name == "matmul")
    return {as_vector(
        at::mm(as_tensor(c.inputs[0][0], c.input_dims[0]), as_tensor(c.inputs[0][1], c.input_dims[1])))};
  if (c.name == "all_reduce") {
    at::Tensor sum = at::zeros(c.input_dims[0], at::kFloat);
    for (const auto& replica : c.inputs) sum = sum + as_tensor(replica[0], c.input_dims[0]);
    return std::vector<std::vector<float>>(c.inputs.size(), as_vector(sum));
  }
  throw Error("[xla-probe] no LibTorch reference for case '" + c.name + "'");
}

int run_xla_probe(const XlaProbeConfig& config) {
  xla::ProbeOptions options;
  options.plugin_path = xla::plugin_path_from(config.plugin);
  for (const std::string& text : config.options)
    options.create_options.push_back(xla::parse_create_option(text));
  // Defaults that make the probe meaningful, unless given: two CPU devices
  // (for the all-reduce), and no up-front grab of GPU memory.
  auto given = [&options](const std::string& name) {
    return std::any_of(options.create_options.begin(), options.create_options.end(),
                       [&name](const xla::NamedValue& v) { return v.name == name; });
  };
  const std::string kind = xla::plugin_kind(options.plugin_path);
  if (kind == "cpu" && !given("cpu_device_count"))
    options.create_options.push_back({"cpu_device_count", int64_t{2}});
  if ((kind == "cuda" || kind == "rocm") && !given("preallocate"))
    options.create_options.push_back({"preallocate", false});
  options.reference_name = "libtorch";
  options.reference = libtorch_reference;

  const xla::ProbeReport report = xla::run_probe(options);
  const std::string json = report.json();
  std::cout << json;
  if (!config.out.empty()) {
    std::ofstream file(config.out);
    file << json;
    STRATA_CHECK(file.good(), ConfigError, "[xla-probe] cannot write the report to ", config.out);
  }
  return report.ok() ? 0 : 1;
}

}  // namespace

Command make_xla_probe_command() {
  auto config = std::make_shared<XlaProbeConfig>();
  Command command;
  command.register_fn = [config](CLI::App& app) {
    CLI::App* probe = app.add_subcommand(
        "xla-probe",
        "Load a PJRT plugin (an XLA runtime: CPU, CUDA, TPU) and print one JSON object:\n"
        "its PJRT C API version, attributes, platform and devices, and the results of an\n"
        "add, a matmul and a 2-replica all-reduce (run when the client has 2 devices)\n"
        "compiled from strata's StableHLO and compared with LibTorch on the host.\n"
        "Exit status 0 when every case that ran matched.\n"
        "Defaults: cpu_device_count=2 for a CPU plugin, preallocate=false for a GPU one.\n"
        "Example: strata xla-probe --plugin .../jax_plugins/xla_cuda13/xla_cuda_plugin.so");
    probe->add_option("--plugin", config->plugin,
                      "The plugin's shared library (default: $STRATA_PJRT_PLUGIN)");
    probe->add_option("--option", config->options,
                      "A PJRT_Client_Create option NAME=VALUE (repeatable); options the plugin\n"
                      "does not list are left out and reported");
    probe->add_option("--out", config->out, "Also write the JSON to this file");
    return probe;
  };
  command.run = [config] { return run_xla_probe(*config); };
  return command;
}

}  // namespace strata::cli
