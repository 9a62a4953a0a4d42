// strata-xla-probe: `strata xla-probe` without LibTorch, for machines where
// only a PJRT plugin is at hand (scripts/xla-gpu-probe.sh builds it with one
// compiler call). The host reference is plain loops.
//   strata-xla-probe [--plugin PATH] [--option NAME=VALUE]... [--out FILE]
// VALUE is an integer, true/false, a float with a '.', or a string.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>

#include "strata/xla/client.h"
#include "strata/xla/probe.h"

int main(int argc, char** argv) {
  using namespace strata::xla;
  try {
    std::string plugin, out;
    std::vector<NamedValue> options;
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
      else if (arg == "--help" || arg == "-h") {
        std::cout << "usage: strata-xla-probe [--plugin PATH] [--option NAME=VALUE]... [--out FILE]\n";
        return 0;
      } else {
        throw strata::ConfigError("[xla-probe] unknown argument '" + arg + "'; see --help");
      }
    }
    ProbeOptions probe;
    probe.plugin_path = plugin_path_from(plugin);
    probe.create_options = options;
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
