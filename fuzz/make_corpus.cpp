// Writes the seed corpus of the fuzz targets: small real checkpoints made
// by the library itself. Usage: make_corpus OUT_DIR (creates
// OUT_DIR/{safetensors,metadata,sharded}/).
#include <stdlib.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "entry_points.h"
#include "strata/checkpoint/directory.h"
#include "strata/checkpoint/sharded.h"

namespace fs = std::filesystem;
using namespace strata::checkpoint;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void put(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

nlohmann::json sgd_state(const std::vector<std::string>& params) {
  nlohmann::json state = nlohmann::json::object();
  for (const std::string& p : params) state[p] = {{"tensors", {"momentum_buffer"}}};
  return {{"type", "sgd"},
          {"param_groups",
           {{{"params", params},
             {"options", {{"lr", 0.1}, {"momentum", 0.9}, {"dampening", 0.0}, {"weight_decay", 0.0}, {"nesterov", false}}}}}},
          {"state", state}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_corpus OUT_DIR\n";
    return 2;
  }
  const fs::path out = argv[1];
  char tmp_pattern[] = "/tmp/strata-corpus-XXXXXX";
  const fs::path tmp = ::mkdtemp(tmp_pattern);
  for (const char* sub : {"safetensors", "metadata", "sharded"}) fs::create_directories(out / sub);

  at::manual_seed(3);
  // Safetensors files: several dtypes, a 0-d, an empty and a 1-element tensor.
  write_safetensors((tmp / "a.safetensors").string(),
                    {{"w", at::randn({3, 2})}, {"b", at::randn({2}).to(at::kBFloat16)},
                     {"n", at::tensor({int64_t(7), int64_t(-1)})}, {"s", at::scalar_tensor(2.5)},
                     {"e", at::empty({0, 3})}, {"one", at::ones({1}, at::kHalf)},
                     {"m", at::tensor({true, false, true})}},
                    {{"note", "seed"}});
  put(out / "safetensors" / "dtypes.safetensors", slurp((tmp / "a.safetensors").string()));
  write_safetensors((tmp / "b.safetensors").string(), {});
  put(out / "safetensors" / "empty.safetensors", slurp((tmp / "b.safetensors").string()));

  // A full checkpoint with the tensors metadata_input() lays out.
  const nlohmann::json entries = {
      {"model", {{"kind", "module"}}},
      {"optimizer", {{"kind", "optimizer"}, {"state", sgd_state({"w"})}}},
      {"rng", {{"kind", "tensor"}}},
      {"step", {{"kind", "value"}, {"value", 42}}},
      {"loader", {{"kind", "value"}, {"value", {{"epoch", 1}, {"position", 3}}}}}};
  write_checkpoint_dir((tmp / "full").string(),
                       {{kFullStateFile, {{"model/w", at::arange(6, at::kFloat).reshape({2, 3})},
                                          {"optimizer/w.momentum_buffer", at::ones({2, 3})},
                                          {"rng", at::arange(5, at::kByte)}}}},
                       {{"strategy", "ddp"}, {"world_size", 1}, {"state_dict_type", "full"}, {"entries", entries}});
  put(out / "metadata" / "full.json", slurp((tmp / "full" / kMetadataFile).string()));
  put(out / "safetensors" / "state.safetensors", slurp((tmp / "full" / kFullStateFile).string()));

  // The same, resharded for two ranks.
  reshard_checkpoint(StateReader::open((tmp / "full").string()), (tmp / "sharded").string(), 2);
  const std::string meta = slurp((tmp / "sharded" / kMetadataFile).string());
  const std::string r0 = slurp((tmp / "sharded" / shard_file_name(0, 2)).string());
  const std::string r1 = slurp((tmp / "sharded" / shard_file_name(1, 2)).string());
  put(out / "sharded" / "world2.bin", strata::fuzz::pack_sharded(meta, r0, r1));
  put(out / "metadata" / "sharded.json", meta);
  put(out / "safetensors" / "shard0.safetensors", r0);
  fs::remove_all(tmp);
  std::cout << "seed corpus written to " << out.string() << "\n";
  return 0;
}
