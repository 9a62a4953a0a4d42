// A library that exports std::filesystem::remove_all, as torch 2.11's
// libtorch.so does (Note [libstdc++ before LibTorch] in CMakeLists.txt).
// This copy aborts, so a program whose calls bind to it fails.
#include <cstdlib>
#include <filesystem>

namespace std::filesystem {
uintmax_t remove_all(const path&) { std::abort(); }
}  // namespace std::filesystem
