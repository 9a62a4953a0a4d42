// The key-value store of a multi-process client: the callbacks PJRT calls,
// and a store of files for the probe and the tests.
#include "key_value.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "strata/core/error.h"

namespace strata::xla {

// Note [Multi-process clients]
// A plugin that spans several processes (the CUDA and ROCm plugins; XLA's
// CPU plugin does not) is created in each process with its node_id and
// num_nodes and with three callbacks on one store that all of them reach.
// At creation each process puts its local topology under its own key and
// gets the others', waiting up to the plugin's timeout; that is how every
// process learns the global device ids that a DeviceAssignment names. Then
// each process compiles the same program for all the devices and executes
// it with the argument lists of its own devices only (PJRT's
// execute_device is not the way: it runs single-device "portable"
// programs, and a replicated one is refused there); the collectives inside
// meet across the processes through the plugin's own transport (NCCL on
// GPUs).
//
// The callbacks run on the plugin's threads, so they never throw: a store
// error becomes a PJRT error made with the plugin's callback_error, which
// the plugin then reports from PJRT_Client_Create as its own failure. A key
// that did not appear in time is DEADLINE_EXCEEDED for a get and NOT_FOUND
// for a try-get, the codes the plugin's store adapter expects. A value
// handed out is a copy the plugin frees through the deleter given with it.
namespace {

PJRT_Error* callback_failure(PJRT_CallbackError* make, PJRT_Error_Code code,
                                   const std::string& message) {
  if (make == nullptr || *make == nullptr) return nullptr;  // nothing to report it with
  return (*make)(code, message.data(), message.size());
}

void delete_value(char* value) { delete[] value; }

template <class Args>
void hand_out(Args* args, const std::string& value) {
  char* copy = new char[value.size() + 1];
  std::memcpy(copy, value.data(), value.size());
  copy[value.size()] = '\0';
  args->value = copy;
  args->value_size = value.size();
  args->value_deleter_callback = delete_value;
}

// A get waits up to its timeout and reports a key that never came as
// DEADLINE_EXCEEDED; a try-get looks once and reports NOT_FOUND.
template <class Args>
PJRT_Error* read(Args* args, std::chrono::milliseconds timeout, PJRT_Error_Code missing,
                       const std::string& why_missing) {
  const std::string key(args->key, args->key_size);
  try {
    const std::optional<std::string> value = static_cast<KeyValueStore*>(args->user_arg)->get(key, timeout);
    if (!value) return callback_failure(args->callback_error, missing, "[pjrt] key '" + key + "' " + why_missing);
    hand_out(args, *value);
    return nullptr;
  } catch (const std::exception& e) {
    return callback_failure(args->callback_error, PJRT_Error_Code_UNAVAILABLE,
                            "[pjrt] getting key '" + key + "' from the store: " + e.what());
  }
}

PJRT_Error* kv_get(PJRT_KeyValueGetCallback_Args* args) {
  return read(args, std::chrono::milliseconds(args->timeout_in_ms), PJRT_Error_Code_DEADLINE_EXCEEDED,
              "was not set within " + std::to_string(args->timeout_in_ms) +
                  " ms: a process of the client did not start or did not reach it");
}

PJRT_Error* kv_try_get(PJRT_KeyValueTryGetCallback_Args* args) {
  return read(args, std::chrono::milliseconds(0), PJRT_Error_Code_NOT_FOUND, "is not set");
}

PJRT_Error* kv_put(PJRT_KeyValuePutCallback_Args* args) {
  const std::string key(args->key, args->key_size);
  try {
    static_cast<KeyValueStore*>(args->user_arg)->set(key, std::string(args->value, args->value_size));
    return nullptr;
  } catch (const std::exception& e) {
    return callback_failure(args->callback_error, PJRT_Error_Code_UNAVAILABLE,
                            "[pjrt] setting key '" + key + "' in the store: " + e.what());
  }
}

// Keys are the plugin's text (slashes, colons); a file name holds them as hex.
std::string file_name_of(const std::string& key) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(key.size() * 2);
  for (unsigned char c : key) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

class DirectoryStore final : public KeyValueStore {
 public:
  explicit DirectoryStore(std::string dir) : dir_(std::move(dir)) {
    STRATA_CHECK(!dir_.empty(), ConfigError, "[pjrt] the key-value folder is empty");
    ::mkdir(dir_.c_str(), 0700);  // an existing folder is fine; a missing one fails below
    struct stat st {};
    STRATA_CHECK(::stat(dir_.c_str(), &st) == 0 && S_ISDIR(st.st_mode), ConfigError, "[pjrt] key-value folder '",
                 dir_, "' cannot be made or is not a folder");
  }

  std::optional<std::string> get(const std::string& key, std::chrono::milliseconds timeout) override {
    STRATA_CHECK(key.size() <= kMaxKey, ConfigError, "[pjrt] key of ", key.size(), " bytes");
    const std::string path = dir_ + "/" + file_name_of(key);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (auto pause = std::chrono::milliseconds(1);; pause = std::min(pause * 2, std::chrono::milliseconds(50))) {
      std::ifstream in(path, std::ios::binary);
      if (in) {
        std::ostringstream text;
        text << in.rdbuf();
        std::string value = text.str();
        STRATA_CHECK(value.size() <= kMaxValue, ConfigError, "[pjrt] value of key '", key, "' is ", value.size(),
                     " bytes, over ", kMaxValue);
        return value;
      }
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(pause);
    }
  }

  void set(const std::string& key, const std::string& value) override {
    STRATA_CHECK(key.size() <= kMaxKey && value.size() <= kMaxValue, ConfigError, "[pjrt] key of ", key.size(),
                 " bytes or value of ", value.size(), " bytes is too large");
    const std::string path = dir_ + "/" + file_name_of(key);
    const std::string partial = path + ".partial." + std::to_string(::getpid());
    {
      std::ofstream out(partial, std::ios::binary | std::ios::trunc);
      out.write(value.data(), static_cast<std::streamsize>(value.size()));
      STRATA_CHECK(out.good(), ConfigError, "[pjrt] cannot write ", partial, ": ", std::strerror(errno));
    }
    STRATA_CHECK(::rename(partial.c_str(), path.c_str()) == 0, ConfigError, "[pjrt] cannot rename ", partial,
                 " to ", path, ": ", std::strerror(errno));
  }

 private:
  // A file name is the key in hex plus ".partial.<pid>": 2 * 110 + 20 fits
  // in NAME_MAX (255). The plugins' keys are a few dozen bytes.
  static constexpr size_t kMaxKey = 110;
  static constexpr size_t kMaxValue = 64 << 20;  // a topology is kilobytes
  std::string dir_;
};

}  // namespace

std::shared_ptr<KeyValueStore> directory_store(std::string dir) {
  return std::make_shared<DirectoryStore>(std::move(dir));
}

void attach_store(PJRT_Client_Create_Args& args, KeyValueStore* store) {
  args.kv_get_callback = kv_get;
  args.kv_get_user_arg = store;
  args.kv_put_callback = kv_put;
  args.kv_put_user_arg = store;
  args.kv_try_get_callback = kv_try_get;
  args.kv_try_get_user_arg = store;
}

}  // namespace strata::xla
