// strata-xla-probe: `strata xla-probe` without LibTorch, for machines where
// only a PJRT plugin is at hand (scripts/xla-gpu-probe.sh builds it with one
// compiler call). The host reference is plain loops.
//   strata-xla-probe [--plugin PATH] [--option NAME=VALUE]... [--out FILE]
//                    [--num-nodes N --node-id K --kv-dir DIR]
// VALUE is an integer, true/false, a float with a '.', or a string. With
// --num-nodes, N copies started at once (node ids 0..N-1, one folder that
// all of them reach) make one multi-process client (Note [Multi-process
// clients] in key_value.cpp) and run the cases across the processes.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>

#include "strata/xla/client.h"
#include "strata/xla/probe.h"

int main(int argc, char** argv) {
  using namespace strata::xla;
  try {
    std::string plugin, out, kv_dir;
    std::vector<NamedValue> options;
    int node_id = 0, num_nodes = 1;
    auto count = [](const std::string& flag, const std::string& text) {
      char* end = nullptr;
      const long v = std::strtol(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || v < 0 || v > 4096)
        throw strata::ConfigError("[xla-probe] " + flag + " takes a count from 0 to 4096, got '" + text + "'");
      return static_cast<int>(v);
    };
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw strata::ConfigError("[xla-probe] " + arg + " needs a value");
        return argv[++i];
      };
      if (arg == "--plugin")
        plugin = value();
      else if (arg == "--option")
        options.push_back(parse_create_option(value()));
      else if (arg == "--out")
        out = value();
      else if (arg == "--num-nodes")
        num_nodes = count(arg, value());
      else if (arg == "--node-id")
        node_id = count(arg, value());
      else if (arg == "--kv-dir")
        kv_dir = value();
      else if (arg == "--help" || arg == "-h") {
        std::cout << "usage: strata-xla-probe [--plugin PATH] [--option NAME=VALUE]... [--out FILE]\n"
                     "                        [--num-nodes N --node-id K --kv-dir DIR]\n"
                     "  --num-nodes N   one client across N processes (start N copies, node ids 0..N-1);\n"
                     "                  the plugin must support it (CUDA, ROCm)\n"
                     "  --kv-dir DIR    a folder all N reach, where they exchange their devices\n";
        return 0;
      } else {
        throw strata::ConfigError("[xla-probe] unknown argument '" + arg + "'; see --help");
      }
    }
    ProbeOptions probe;
    probe.plugin_path = plugin_path_from(plugin);
    probe.create_options = options;
    if (num_nodes > 1 && kv_dir.empty()) throw strata::ConfigError("[xla-probe] --num-nodes needs --kv-dir");
    probe.num_nodes = num_nodes == 0 ? 1 : num_nodes;
    probe.node_id = node_id;
    probe.kv_dir = kv_dir;
    const ProbeReport report = run_probe(probe);
    const std::string json = report.json();
    std::cout << json;
    if (!out.empty()) {
      std::ofstream file(out);
      file << json;
      if (!file) throw strata::ConfigError("[xla-probe] cannot write " + out);
    }
    return report.ok() ? 0 : 1;
  } catch (const strata::Error& e) {
    std::cerr << "strata-xla-probe: error: " << e.what() << "\n";
    return 1;
  }
}
