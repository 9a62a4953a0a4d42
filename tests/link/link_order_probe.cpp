// Linked as strata's programs are, and against a library that exports
// std::filesystem::remove_all ahead of libstdc++ on its link line (as
// LibTorch comes before libstdc++ on strata's): the call must still reach
// libstdc++ (Note [libstdc++ before LibTorch] in CMakeLists.txt). Exits 0
// when it removed the three entries it made; the exporter's copy aborts.
#include <cstdio>
#include <filesystem>
#include <string>

#include <unistd.h>

int main() {
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / ("strata-link-order-" + std::to_string(::getpid()));
  std::filesystem::create_directories(root / "a" / "b");
  const auto removed = std::filesystem::remove_all(root);
  std::printf("removed %ju entries\n", static_cast<std::uintmax_t>(removed));
  return removed == 3 && !std::filesystem::exists(root) ? 0 : 1;
}
