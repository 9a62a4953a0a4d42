// What `strata xla-probe` does, without LibTorch: open a PJRT plugin, make
// a client, compile and run three small StableHLO programs (an add, a
// matmul, a 2-replica all-reduce), and compare each result with a host
// reference the caller provides (LibTorch in the CLI, plain loops in the
// LibTorch-free probe binary). The report prints as JSON.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "strata/xla/plugin.h"

namespace strata::xla {

/// One program the probe runs.
struct ProbeCase {
  std::string name;    ///< "add", "matmul", "all_reduce"
  std::string module;  ///< the StableHLO text
  int replicas = 1;
  /// Input shapes, and the values per replica: inputs[replica][arg].
  std::vector<std::vector<int64_t>> input_dims;
  std::vector<std::vector<std::vector<float>>> inputs;
  std::vector<int64_t> output_dims;
  /// Filled by run_probe: outputs[replica], the host reference per
  /// replica, and how they compare.
  std::vector<std::vector<float>> outputs;
  std::vector<std::vector<float>> expected;
  std::vector<size_t> replicas_here;  ///< the replicas outputs[] and expected[] are of
  double max_abs_diff = 0;
  bool passed = false;
  std::string skipped;  ///< why the case did not run; empty when it ran
  std::string error;    ///< the XlaError of a case that failed to compile or run
  double compile_seconds = 0, run_seconds = 0;
};

/// The host reference: one expected output per replica for `c`.
using ProbeReference = std::function<std::vector<std::vector<float>>(const ProbeCase& c)>;

/// The references computed with plain loops (no LibTorch).
std::vector<std::vector<float>> loop_reference(const ProbeCase& c);

/// The probe's three programs with their inputs (not yet run).
std::vector<ProbeCase> probe_cases();

struct ProbeOptions {
  std::string plugin_path;                 ///< resolved already (plugin_path_from)
  std::vector<NamedValue> create_options;  ///< filtered by the plugin's list
  std::string reference_name = "loops";    ///< named in the JSON
  ProbeReference reference = loop_reference;
  double tolerance = 1e-5;  ///< max |out - expected| / (1 + |expected|)
  /// A multi-process client (Note [Multi-process clients]): this process
  /// is node_id of num_nodes, and they meet through files in kv_dir.
  int node_id = 0;
  int num_nodes = 1;
  std::string kv_dir;
};

struct ProbeReport {
  std::string plugin_path, plugin_kind, platform_name, platform_version, reference_name;
  ApiVersion api_version, strata_version;
  std::vector<NamedValue> attributes, sent_options;
  std::vector<std::string> dropped_options;
  struct DeviceInfo {
    int id, process_index;
    std::string kind, description;
  };
  std::vector<DeviceInfo> devices;
  int addressable_devices = 0;
  int node_id = 0, num_nodes = 1, process_index = 0;
  std::vector<ProbeCase> cases;
  double load_seconds = 0, client_seconds = 0;

  /// Every case that ran passed, and at least one ran.
  bool ok() const;
  /// The report as JSON (a single object, pretty-printed).
  std::string json() const;
};

/// Runs the probe. Throws XlaError or ConfigError when the plugin cannot
/// be loaded or the client cannot be made; a failing case is recorded in
/// the report, not thrown.
ProbeReport run_probe(const ProbeOptions& options);

}  // namespace strata::xla
