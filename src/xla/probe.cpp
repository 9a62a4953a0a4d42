// The probe behind `strata xla-probe` (include/strata/xla/probe.h).
#include "strata/xla/probe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "strata/xla/client.h"
#include "strata/xla/stablehlo.h"

namespace strata::xla {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::vector<float> ramp(int64_t n, float scale, float offset) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = scale * static_cast<float>(i % 13) + offset;
  return v;
}

// A tiny JSON writer: enough for the report, with strings escaped.
std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

template <class T, class F>
std::string list(const std::vector<T>& items, F&& item) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + item(items[i]);
  return out + "]";
}

std::string named_values(const std::vector<NamedValue>& values) {
  std::string out = "{";
  for (size_t i = 0; i < values.size(); ++i) {
    const NamedValue& v = values[i];
    std::string value;
    if (const auto* s = std::get_if<std::string>(&v.value))
      value = quote(*s);
    else if (const auto* n = std::get_if<int64_t>(&v.value))
      value = std::to_string(*n);
    else if (const auto* l = std::get_if<std::vector<int64_t>>(&v.value))
      value = list(*l, [](int64_t x) { return std::to_string(x); });
    else if (const auto* f = std::get_if<float>(&v.value))
      value = number(*f);
    else
      value = std::get<bool>(v.value) ? "true" : "false";
    out += (i ? ", " : "") + quote(v.name) + ": " + value;
  }
  return out + "}";
}

std::string floats(const std::vector<float>& v) {
  return list(v, [](float x) { return number(x); });
}

}  // namespace

std::vector<std::vector<float>> loop_reference(const ProbeCase& c) {
  if (c.name == "add") {
    const auto& a = c.inputs[0][0];
    const auto& b = c.inputs[0][1];
    std::vector<float> out(a.size());
    for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
    return {out};
  }
  if (c.name == "matmul") {
    const int64_t m = c.input_dims[0][0], k = c.input_dims[0][1], n = c.input_dims[1][1];
    const auto& a = c.inputs[0][0];
    const auto& b = c.inputs[0][1];
    std::vector<float> out(static_cast<size_t>(m * n));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < k; ++p) acc += double(a[i * k + p]) * double(b[p * n + j]);
        out[static_cast<size_t>(i * n + j)] = static_cast<float>(acc);
      }
    return {out};
  }
  // all_reduce: every replica gets the sum over replicas.
  std::vector<float> sum(c.inputs[0][0].size(), 0.f);
  for (const auto& replica : c.inputs)
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += replica[0][i];
  return std::vector<std::vector<float>>(c.inputs.size(), sum);
}

std::vector<ProbeCase> probe_cases() {
  using stablehlo::Function;
  using stablehlo::Module;
  using stablehlo::Type;
  std::vector<ProbeCase> cases;
  {
    ProbeCase c;
    c.name = "add";
    c.input_dims = {{8}, {8}};
    c.output_dims = {8};
    c.inputs = {{ramp(8, 0.5f, -1.f), ramp(8, 0.25f, 3.f)}};
    Function f("main", {Type{ElementType::kF32, {8}}, Type{ElementType::kF32, {8}}});
    f.returns({f.add(f.arg(0), f.arg(1))});
    Module m("probe_add");
    m.add(f);
    c.module = m.text();
    cases.push_back(std::move(c));
  }
  {
    ProbeCase c;
    c.name = "matmul";
    c.input_dims = {{4, 8}, {8, 3}};
    c.output_dims = {4, 3};
    c.inputs = {{ramp(32, 0.125f, -0.75f), ramp(24, -0.25f, 1.f)}};
    Function f("main", {Type{ElementType::kF32, {4, 8}}, Type{ElementType::kF32, {8, 3}}});
    f.returns({f.dot_general(f.arg(0), f.arg(1), {{}, {}, {1}, {0}})});
    Module m("probe_matmul");
    m.add(f);
    c.module = m.text();
    cases.push_back(std::move(c));
  }
  {
    ProbeCase c;
    c.name = "all_reduce";
    c.replicas = 2;
    c.input_dims = {{6}};
    c.output_dims = {6};
    c.inputs = {{ramp(6, 1.f, 0.5f)}, {ramp(6, -0.5f, 10.f)}};
    Function f("main", {Type{ElementType::kF32, {6}}});
    f.returns({f.all_reduce(f.arg(0), stablehlo::ReduceOp::kSum, {{0, 1}})});
    Module m("probe_all_reduce", /*num_replicas=*/2);
    m.add(f);
    c.module = m.text();
    cases.push_back(std::move(c));
  }
  return cases;
}

bool ProbeReport::ok() const {
  bool ran = false;
  for (const ProbeCase& c : cases) {
    if (!c.skipped.empty()) continue;
    ran = true;
    if (!c.passed) return false;
  }
  return ran;
}

ProbeReport run_probe(const ProbeOptions& options) {
  ProbeReport report;
  report.plugin_path = options.plugin_path;
  report.plugin_kind = plugin_kind(options.plugin_path);
  report.reference_name = options.reference_name;
  report.strata_version = strata_api_version();

  auto start = Clock::now();
  std::shared_ptr<const Plugin> plugin = Plugin::load(options.plugin_path);
  report.load_seconds = seconds_since(start);
  report.api_version = plugin->version();
  report.attributes = plugin->attributes();

  start = Clock::now();
  ClientOptions client_options;
  client_options.create_options = options.create_options;
  if (options.num_nodes > 1)
    client_options.multi_process(options.node_id, options.num_nodes, directory_store(options.kv_dir));
  Client client = Client::create(plugin, client_options);
  report.client_seconds = seconds_since(start);
  report.node_id = options.node_id;
  report.num_nodes = options.num_nodes;
  report.process_index = client.process_index();
  report.sent_options = client.sent_options();
  report.dropped_options = client.dropped_options();
  report.platform_name = client.platform_name();
  report.platform_version = client.platform_version();
  std::vector<Device> all = client.devices();
  for (const Device& d : all) report.devices.push_back({d.id, d.process_index, d.kind, d.description});
  const std::vector<Device> local = client.addressable_devices();
  report.addressable_devices = static_cast<int>(local.size());
  // Replica r runs on pool[r]: this process's devices in a one-process
  // client; every process's, by process then id, in a multi-process one,
  // where each process feeds and checks only the replicas on its devices.
  std::vector<Device> pool = local;
  if (options.num_nodes > 1) {
    pool = all;
    std::stable_sort(pool.begin(), pool.end(), [](const Device& a, const Device& b) {
      return a.process_index != b.process_index ? a.process_index < b.process_index : a.id < b.id;
    });
  }

  for (ProbeCase& c : probe_cases()) {
    if (static_cast<int>(pool.size()) < c.replicas) {
      c.skipped = strata::detail::cat("needs ", c.replicas, " devices, the client has ", pool.size());
      report.cases.push_back(std::move(c));
      continue;
    }
    try {
      CompileOptions compile;
      compile.num_replicas = c.replicas;
      std::vector<size_t> here;  // the replicas this process runs
      for (int r = 0; r < c.replicas; ++r) {
        compile.device_assignment.push_back({pool[static_cast<size_t>(r)].id});
        if (pool[static_cast<size_t>(r)].process_index == report.process_index) here.push_back(static_cast<size_t>(r));
      }
      if (here.empty()) {
        c.skipped = "no replica of this case runs on this process's devices";
        report.cases.push_back(std::move(c));
        continue;
      }
      auto t = Clock::now();
      LoadedExecutable exe = client.compile(c.module, compile);
      c.compile_seconds = seconds_since(t);
      t = Clock::now();
      std::vector<std::vector<Buffer>> inputs(here.size());
      std::vector<std::vector<const Buffer*>> arguments(here.size());
      for (size_t h = 0; h < here.size(); ++h) {
        const size_t r = here[h];
        for (size_t a = 0; a < c.input_dims.size(); ++a) {
          const std::vector<float>& values = c.inputs[r][a];
          inputs[h].push_back(client.buffer_from_host(values.data(), values.size() * sizeof(float),
                                                      ElementType::kF32, c.input_dims[a], pool[r]));
        }
        for (const Buffer& b : inputs[h]) arguments[h].push_back(&b);
      }
      std::vector<std::vector<Buffer>> outputs = exe.execute(arguments);
      for (auto& replica : outputs) {
        std::vector<uint8_t> bytes = replica.at(0).to_host();
        std::vector<float> values(bytes.size() / sizeof(float));
        std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
        c.outputs.push_back(std::move(values));
      }
      c.run_seconds = seconds_since(t);
      const std::vector<std::vector<float>> expected = options.reference(c);
      for (size_t r : here) c.expected.push_back(r < expected.size() ? expected[r] : std::vector<float>());
      c.replicas_here = here;
      c.passed = c.expected.size() == c.outputs.size();
      for (size_t r = 0; c.passed && r < c.outputs.size(); ++r) {
        if (c.outputs[r].size() != c.expected[r].size()) {
          c.passed = false;
          break;
        }
        for (size_t i = 0; i < c.outputs[r].size(); ++i) {
          const double diff = std::fabs(double(c.outputs[r][i]) - double(c.expected[r][i]));
          c.max_abs_diff = std::max(c.max_abs_diff, diff);
          if (!(diff <= options.tolerance * (1.0 + std::fabs(double(c.expected[r][i]))))) c.passed = false;
        }
      }
    } catch (const Error& e) {
      c.error = e.what();
      c.passed = false;
    }
    report.cases.push_back(std::move(c));
  }
  return report;
}

std::string ProbeReport::json() const {
  std::string out = "{\n";
  out += "  \"ok\": " + std::string(ok() ? "true" : "false") + ",\n";
  out += "  \"plugin\": " + quote(plugin_path) + ",\n";
  out += "  \"plugin_kind\": " + quote(plugin_kind) + ",\n";
  out += "  \"pjrt_api_version\": " + quote(strata::detail::cat(api_version.major, ".", api_version.minor)) +
         ",\n";
  out += "  \"strata_pjrt_api_version\": " +
         quote(strata::detail::cat(strata_version.major, ".", strata_version.minor)) + ",\n";
  out += "  \"attributes\": " + named_values(attributes) + ",\n";
  out += "  \"create_options_sent\": " + named_values(sent_options) + ",\n";
  out += "  \"create_options_dropped\": " + list(dropped_options, quote) + ",\n";
  out += "  \"platform\": " + quote(platform_name) + ",\n";
  out += "  \"platform_version\": " + quote(platform_version) + ",\n";
  out += "  \"devices\": " +
         list(devices,
              [](const DeviceInfo& d) {
                return "{\"id\": " + std::to_string(d.id) +
                       ", \"process_index\": " + std::to_string(d.process_index) +
                       ", \"kind\": " + quote(d.kind) + ", \"description\": " + quote(d.description) + "}";
              }) +
         ",\n";
  out += "  \"addressable_devices\": " + std::to_string(addressable_devices) + ",\n";
  out += "  \"node_id\": " + std::to_string(node_id) + ", \"num_nodes\": " + std::to_string(num_nodes) +
         ", \"process_index\": " + std::to_string(process_index) + ",\n";
  out += "  \"reference\": " + quote(reference_name) + ",\n";
  out += "  \"load_seconds\": " + number(load_seconds) + ",\n";
  out += "  \"client_seconds\": " + number(client_seconds) + ",\n";
  out += "  \"cases\": [";
  for (size_t i = 0; i < cases.size(); ++i) {
    const ProbeCase& c = cases[i];
    out += i ? ",\n    {" : "\n    {";
    out += "\"name\": " + quote(c.name) + ", \"replicas\": " + std::to_string(c.replicas);
    if (!c.skipped.empty()) {
      out += ", \"skipped\": " + quote(c.skipped) + "}";
      continue;
    }
    out += ", \"passed\": " + std::string(c.passed ? "true" : "false");
    if (!c.error.empty()) {
      out += ", \"error\": " + quote(c.error) + "}";
      continue;
    }
    out += ", \"replicas_here\": " + list(c.replicas_here, [](size_t r) { return std::to_string(r); }) +
           ", \"max_abs_diff\": " + number(c.max_abs_diff) +
           ", \"compile_seconds\": " + number(c.compile_seconds) +
           ", \"run_seconds\": " + number(c.run_seconds) +
           ", \"output_dims\": " + list(c.output_dims, [](int64_t d) { return std::to_string(d); }) +
           ", \"outputs\": " + list(c.outputs, floats) + ", \"expected\": " + list(c.expected, floats) + "}";
  }
  out += "\n  ]\n}\n";
  return out;
}

}  // namespace strata::xla
