// Atomic files and checkpoint directories: what a reader sees after a save,
// an interrupted save, a replacement and a damaged directory.
#include "strata/checkpoint/atomic.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint/test_util.h"
#include "strata/checkpoint/directory.h"
#include "strata/core/error.h"

namespace strata::checkpoint {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::read_bytes;
using testing::write_bytes;
using testing::dead_pid;
namespace fs = std::filesystem;

class AtomicTest : public testing::ScratchDir {};
class CheckpointDirTest : public testing::ScratchDir {};

// Expects `fn` to throw a CheckpointError containing every string of `parts`.
template <class Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected: " << parts.front();
  } catch (const CheckpointError& e) {
    for (const auto& part : parts) EXPECT_THAT(e.what(), HasSubstr(part));
  }
}

TEST_F(AtomicTest, AtomicWriteReplacesTheFileAndLeavesNoTemporary) {
  atomic_write_file(path("f.txt"), "first");
  atomic_write_file(path("f.txt"), "second");
  EXPECT_EQ(read_bytes(path("f.txt")), "second");
  EXPECT_THAT(listing(), ElementsAre("f.txt"));
}

TEST_F(AtomicTest, UncommittedFileLeavesThePreviousContentAndNoTemporary) {
  atomic_write_file(path("f.txt"), "old");
  {
    AtomicFile file(path("f.txt"));
    file.write("new and partial", 15);
    EXPECT_TRUE(fs::exists(file.temp_path()));
    EXPECT_EQ(read_bytes(path("f.txt")), "old");
  }  // destroyed without commit: an exception unwinding through a save
  EXPECT_EQ(read_bytes(path("f.txt")), "old");
  EXPECT_THAT(listing(), ElementsAre("f.txt"));
}

TEST_F(AtomicTest, FileSystemErrorsNameThePathAndErrno) {
  expect_error([&] { atomic_write_file(path("no/such/dir/f.txt"), "x"); },
               {"[checkpoint] " + path("no/such/dir/f.txt"), "No such file or directory"});
}

TEST_F(AtomicTest, FullDiskNamesTheFileAndSaysWhatToDo) {
  atomic_write_file(path("model.safetensors"), "old");
  {
    AtomicFile file(path("model.safetensors"));
    // The temporary file's descriptor now writes to /dev/full: ENOSPC.
    const int full = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
    if (full == -1) GTEST_SKIP() << "/dev/full is missing, so a full disk cannot be simulated";
    ASSERT_EQ(::dup2(full, file.fd()), file.fd());
    ::close(full);
    try {
      file.write("tensor bytes", 12);
      ADD_FAILURE() << "writing to a full disk succeeded";
    } catch (const CheckpointError& e) {
      EXPECT_EQ(std::string(e.what()),
                "[checkpoint] " + path("model.safetensors") +
                    ": no space left on device while writing 12 bytes; free space on that file "
                    "system or save to another folder, then save again (earlier checkpoints are "
                    "untouched)");
    }
  }
  EXPECT_EQ(read_bytes(path("model.safetensors")), "old");
  EXPECT_THAT(listing(), ElementsAre("model.safetensors"));
}

TEST_F(CheckpointDirTest, SavedDirectoryHoldsFilesMetadataAndMarker) {
  const at::Tensor w = at::arange(6, at::kFloat).reshape({2, 3});
  write_checkpoint_dir(path("ckpt"),
                       {{"model.safetensors", {{"w", w}}},
                        {"optimizer.safetensors", {{"w.exp_avg", at::zeros({2, 3})}}}},
                       {{"step", 12}, {"strategy", "ddp"}});
  EXPECT_THAT(listing(), ElementsAre("ckpt"));  // no staging directory left
  EXPECT_TRUE(is_complete(path("ckpt")));
  EXPECT_TRUE(fs::exists(path("ckpt/.complete")));

  const auto raw = nlohmann::json::parse(read_bytes(path("ckpt/metadata.json")));
  EXPECT_EQ(raw["format"], "strata-checkpoint");
  EXPECT_EQ(raw["version"], 1);
  EXPECT_EQ(raw["files"], nlohmann::json({"model.safetensors", "optimizer.safetensors"}));
  EXPECT_EQ(raw["step"], 12);

  CheckpointReader reader = CheckpointReader::open(path("ckpt"));
  EXPECT_EQ(reader.path(), path("ckpt"));
  EXPECT_EQ(reader.metadata()["strategy"], "ddp");
  EXPECT_THAT(reader.files(), ElementsAre("model.safetensors", "optimizer.safetensors"));
  EXPECT_TRUE(at::equal(reader.open_file("model.safetensors").load("w"), w));
  expect_error([&] { reader.open_file("rank0.safetensors"); },
               {path("ckpt"), "has no file 'rank0.safetensors'"});
}

TEST_F(CheckpointDirTest, DirectoryWithoutMarkerIsRefusedAsIncomplete) {
  write_checkpoint_dir(path("ckpt"), {{"model.safetensors", {{"w", at::ones({2})}}}});
  fs::remove(path("ckpt/.complete"));
  EXPECT_FALSE(is_complete(path("ckpt")));
  expect_error([&] { CheckpointReader::open(path("ckpt")); },
               {path("ckpt") + " is incomplete: it has no .complete marker",
                "the save that wrote it did not finish"});
  // A later save refuses to overwrite what it cannot recognise as a checkpoint.
  expect_error([&] { CheckpointWriter::begin(path("ckpt")); },
               {"exists and is not a complete strata checkpoint; refusing to overwrite it"});
}

TEST_F(CheckpointDirTest, InterruptedSaveLeavesThePreviousCheckpointLoadable) {
  write_checkpoint_dir(path("ckpt"), {{"model.safetensors", {{"w", at::full({3}, 1.f)}}}},
                       {{"step", 1}});
  // A save that dies after writing its files but before commit: the writer
  // is never destroyed, as if the process had been killed.
  auto* crashed = new CheckpointWriter(CheckpointWriter::begin(path("ckpt")));
  crashed->write_file("model.safetensors", {{"w", at::full({3}, 2.f)}});
  const std::string staging = crashed->staging_dir();
  EXPECT_TRUE(fs::is_directory(staging));
  EXPECT_FALSE(is_complete(staging));

  CheckpointReader reader = CheckpointReader::open(path("ckpt"));
  EXPECT_EQ(reader.metadata()["step"], 1);
  EXPECT_TRUE(at::equal(reader.open_file("model.safetensors").load("w"), at::full({3}, 1.f)));
  expect_error([&] { CheckpointReader::open(staging); }, {"is incomplete"});

  // The next save replaces the old checkpoint and ignores the leftover.
  write_checkpoint_dir(path("ckpt"), {{"model.safetensors", {{"w", at::full({3}, 3.f)}}}},
                       {{"step", 3}});
  reader = CheckpointReader::open(path("ckpt"));
  EXPECT_EQ(reader.metadata()["step"], 3);
  EXPECT_TRUE(at::equal(reader.open_file("model.safetensors").load("w"), at::full({3}, 3.f)));
  EXPECT_THAT(listing(), ElementsAre("ckpt", fs::path(staging).filename().string()));
}

TEST_F(CheckpointDirTest, ProcessKilledMidSaveLeavesThePreviousCheckpointLoadable) {
  write_checkpoint_dir(path("ckpt"), {{"model.safetensors", {{"a", at::full({4}, 1.f)}}}},
                       {{"step", 1}});
  const pid_t child = ::fork();
  ASSERT_NE(child, -1);
  if (child == 0) {
    // Half a streamed file written, then SIGKILL: no destructor, no commit.
    CheckpointWriter writer = CheckpointWriter::begin(path("ckpt"));
    SafetensorsWriter file = writer.open_file(
        "model.safetensors", {TensorSpec{"a", at::kFloat, {4}}, TensorSpec{"b", at::kFloat, {4}}});
    file.write("a", at::full({4}, 2.f));
    ::kill(::getpid(), SIGKILL);
    ::_exit(0);  // not reached
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;

  CheckpointReader reader = CheckpointReader::open(path("ckpt"));
  EXPECT_EQ(reader.metadata()["step"], 1);
  EXPECT_TRUE(at::equal(reader.open_file("model.safetensors").load("a"), at::full({4}, 1.f)));
  const std::vector<std::string> names = listing();
  ASSERT_EQ(names.size(), 2u);  // ckpt and the dead save's staging directory
  EXPECT_THAT(names[1], ::testing::StartsWith("ckpt.tmp-" + std::to_string(child) + "-"));
  EXPECT_FALSE(is_complete(path(names[1])));
  // Its half-written file never got its final name.
  EXPECT_FALSE(fs::exists(path(names[1]) + "/model.safetensors"));
}

TEST_F(CheckpointDirTest, WriterDestroyedWithoutCommitRemovesItsStaging) {
  {
    CheckpointWriter writer = CheckpointWriter::begin(path("ckpt"));
    writer.write_file("model.safetensors", {{"w", at::ones({2})}});
  }
  EXPECT_TRUE(listing().empty());
}

TEST_F(CheckpointDirTest, ReplacementInterruptedBetweenRenamesIsRecoveredFromTheAsideCopy) {
  // Where the file system cannot exchange two names atomically, a crash
  // between "rename PATH aside" and "rename staging to PATH" leaves only
  // PATH.old-<pid>-<n>; the reader finds it.
  write_checkpoint_dir(path("ckpt"), {{"model.safetensors", {{"w", at::ones({2})}}}},
                       {{"step", 5}});
  fs::rename(path("ckpt"), path("ckpt.old-123-0"));
  CheckpointReader reader = CheckpointReader::open(path("ckpt"));
  EXPECT_EQ(reader.path(), path("ckpt.old-123-0"));
  EXPECT_EQ(reader.metadata()["step"], 5);
  fs::remove(path("ckpt.old-123-0/.complete"));
  expect_error([&] { CheckpointReader::open(path("ckpt")); },
               {path("ckpt"), "no such checkpoint (the directory does not exist)"});
}

TEST_F(CheckpointDirTest, ReplacementByTwoRenamesLeavesOnlyTheNewCheckpoint) {
  write_checkpoint_dir(path("ckpt"), {{"model.safetensors", {{"w", at::ones({2})}}}},
                       {{"step", 1}});
  fs::create_directory(path("staging"));
  write_safetensors(path("staging/model.safetensors"), {{"w", at::full({2}, 2.f)}});
  atomic_write_file(path("staging/metadata.json"),
                    R"({"format": "strata-checkpoint", "version": 1,)"
                    R"( "files": ["model.safetensors"], "step": 2})");
  expect_error([&] { publish_dir(path("staging"), path("ckpt")); }, {"has no completion marker"});
  atomic_write_file(path("staging/.complete"), "");
  detail::replace_dir_by_renames(path("staging"), path("ckpt"));
  EXPECT_THAT(listing(), ElementsAre("ckpt"));
  CheckpointReader reader = CheckpointReader::open(path("ckpt"));
  EXPECT_EQ(reader.metadata()["step"], 2);
  EXPECT_TRUE(at::equal(reader.open_file("model.safetensors").load("w"), at::full({2}, 2.f)));
}

TEST_F(CheckpointDirTest, ExistingEmptyDirectoryIsReplacedButAUsersDirectoryIsNot) {
  fs::create_directory(path("empty"));
  write_checkpoint_dir(path("empty"), {{"a.safetensors", {{"x", at::ones({1})}}}});
  EXPECT_TRUE(is_complete(path("empty")));

  fs::create_directory(path("mine"));
  write_bytes(path("mine/notes.txt"), "keep me");
  expect_error([&] { write_checkpoint_dir(path("mine"), {}); },
               {path("mine"), "refusing to overwrite it"});
  EXPECT_EQ(read_bytes(path("mine/notes.txt")), "keep me");
  EXPECT_THAT(listing(), ElementsAre("empty", "mine"));
}

TEST_F(CheckpointDirTest, ProcessesJoinAStagingDirectoryAndOneCommits) {
  // The sharded layout: every rank writes its own file, rank 0 commits.
  CheckpointWriter rank0 = CheckpointWriter::begin(path("sharded"));
  CheckpointWriter rank1 = CheckpointWriter::join(path("sharded"), rank0.staging_dir());
  rank1.write_file("rank1.safetensors", {{"w", at::full({2}, 1.f)}});
  SafetensorsWriter stream = rank0.open_file("rank0.safetensors", {TensorSpec{"w", at::kFloat, {2}}});
  stream.write("w", at::full({2}, 0.f));
  stream.close();
  expect_error([&] { rank1.commit(); }, {"must be called by the process that began the save"});
  rank0.commit({{"world_size", 2}});
  CheckpointReader reader = CheckpointReader::open(path("sharded"));
  EXPECT_THAT(reader.files(), ElementsAre("rank0.safetensors", "rank1.safetensors"));
  EXPECT_EQ(reader.metadata()["world_size"], 2);
  expect_error([&] { CheckpointWriter::join(path("x"), path("x.tmp-1-1")); },
               {"staging directory " + path("x.tmp-1-1") + " does not exist"});
}

TEST_F(CheckpointDirTest, BadMetadataIsRefusedWithTheReason) {
  expect_error([&] { write_checkpoint_dir(path("c"), {}, {{"version", 7}}); },
               {"metadata field 'version' is reserved"});
  expect_error([&] { write_checkpoint_dir(path("c"), {}, nlohmann::json::array()); },
               {"must be a JSON object, got array"});
  expect_error([&] { write_checkpoint_dir(path("c"), {{"../x", {}}}); },
               {"file name '../x' must be a plain name"});

  write_checkpoint_dir(path("c"), {});
  const std::string meta = path("c/metadata.json");
  auto edit = [&](const std::string& key, const nlohmann::json& value) {
    auto j = nlohmann::json::parse(read_bytes(meta));
    j[key] = value;
    write_bytes(meta, j.dump());
  };
  edit("version", 2);
  expect_error([&] { CheckpointReader::open(path("c")); },
               {meta, "format version 2 is not supported (this build reads 1 to 1"});
  edit("format", "something-else");
  expect_error([&] { CheckpointReader::open(path("c")); },
               {meta, "format is 'something-else', expected 'strata-checkpoint'"});
  write_bytes(meta, "{not json");
  expect_error([&] { CheckpointReader::open(path("c")); }, {meta, "not valid JSON"});
  fs::remove(meta);
  expect_error([&] { CheckpointReader::open(path("c")); }, {meta, "cannot open"});
  write_bytes(path("file"), "x");
  expect_error([&] { CheckpointReader::open(path("file")); }, {path("file"), "not a directory"});
}

TEST_F(CheckpointDirTest, DamagedTensorFileInsideACheckpointNamesTheFile) {
  write_checkpoint_dir(path("c"), {{"model.safetensors", {{"fc.weight", at::zeros({64})}}}});
  const std::string file = path("c/model.safetensors");
  const std::string bytes = read_bytes(file);
  write_bytes(file, bytes.substr(0, bytes.size() - 100));
  CheckpointReader reader = CheckpointReader::open(path("c"));
  expect_error([&] { reader.open_file("model.safetensors"); },
               {file, "tensor 'fc.weight' needs bytes [0, 256)", "(truncated?)"});
}


TEST_F(CheckpointDirTest, StagingFolderOfADeadSaveIsRemovedWhateverItsOwnerFileHolds) {
  // A save killed between creating its staging folder and writing the
  // owner file leaves no owner file (or only the owner file's temporary);
  // the folder's name says whose it is.
  std::string staging;
  {
    CheckpointWriter writer = CheckpointWriter::begin(path("probe"));
    staging = writer.staging_dir();
  }
  const auto at = staging.rfind('@');
  ASSERT_NE(at, std::string::npos) << staging;
  EXPECT_THAT(staging, ::testing::StartsWith(path("probe.tmp-" + std::to_string(::getpid()) + "-")));
  const std::string host = staging.substr(at + 1);
  const std::string gone = std::to_string(dead_pid());
  auto make = [&](const std::string& name) {
    fs::create_directory(path(name));
    write_bytes(path(name + "/model.safetensors.tmp-" + gone + "-7"), "partial");
    return path(name);
  };
  const std::string no_owner = make("step-1.tmp-" + gone + "-0@" + host);
  const std::string empty_owner = make("step-2.tmp-" + gone + "-1@" + host);
  write_bytes(empty_owner + "/" + kStagingOwner, "");
  const std::string cut_owner = make("step-3.tmp-" + gone + "-2@" + host);
  write_bytes(cut_owner + "/" + kStagingOwner + ".tmp-" + gone + "-3", "host ");
  write_bytes(cut_owner + "/" + kStagingOwner, "host " + host + "\npi");
  const std::string live = make("step-4.tmp-1-3@" + host);  // pid 1 runs
  const std::string mine = make("step-5.tmp-" + std::to_string(::getpid()) + "-4@" + host);
  const std::string elsewhere = make("step-6.tmp-" + gone + "-5@another-host");
  const std::string old_style = make("step-7.tmp-" + gone + "-6");  // older strata, no owner file

  std::vector<std::string> removed = remove_stale_staging(dir_);
  std::sort(removed.begin(), removed.end());
  EXPECT_THAT(removed, ElementsAre(no_owner, empty_owner, cut_owner));
  for (const std::string& kept : {live, mine, elsewhere, old_style}) EXPECT_TRUE(fs::exists(kept)) << kept;
  EXPECT_TRUE(remove_stale_staging(dir_).empty());
}

// A child that has exited but is not reaped: a zombie, until reap().
class Zombie {
 public:
  Zombie() {
    pid_ = ::fork();
    if (pid_ == 0) ::_exit(0);
    // Wait (with a deadline) until /proc shows it exited.
    for (int i = 0; i < 1000 && state() != 'Z'; ++i) ::usleep(10000);
  }
  ~Zombie() { reap(); }
  pid_t pid() const { return pid_; }
  char state() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/stat");
    std::string line;
    std::getline(in, line);
    const auto close = line.rfind(") ");
    return close == std::string::npos ? '?' : line[close + 2];
  }
  void reap() {
    if (pid_ <= 0) return;
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

// Field 22 of /proc/self/stat: what an owner file records as "start".
std::string own_start_time() {
  std::ifstream in("/proc/self/stat");
  std::string line;
  std::getline(in, line);
  std::istringstream fields(line.substr(line.rfind(')') + 2));
  std::string field;
  for (int i = 3; i <= 22; ++i) fields >> field;
  return field;
}

// Note [Who owns a staging directory]: an owner that has exited but is not
// yet reaped owns nothing.
TEST_F(CheckpointDirTest, StagingFolderOfAZombieOwnerIsRemoved) {
  std::string staging;
  {
    CheckpointWriter writer = CheckpointWriter::begin(path("probe"));
    staging = writer.staging_dir();
  }
  const std::string host_tag = staging.substr(staging.rfind('@') + 1);
  char name[256] = {0};
  ::gethostname(name, sizeof(name) - 1);
  Zombie zombie;
  ASSERT_EQ(zombie.state(), 'Z');
  const std::string pid = std::to_string(zombie.pid());
  // As the zombie's save left it: named after it, with its owner file.
  const std::string named = path("step-1.tmp-" + pid + "-0@" + host_tag);
  fs::create_directory(named);
  write_bytes(named + "/model.safetensors", "partial");
  write_bytes(named + "/" + kStagingOwner, "host " + std::string(name) + "\npid " + pid + "\n");
  // Older strata's name: removed on its owner file's word.
  const std::string old_style = path("step-2.tmp-" + pid + "-1");
  fs::create_directory(old_style);
  write_bytes(old_style + "/" + kStagingOwner, "host " + std::string(name) + "\npid " + pid + "\n");
  std::vector<std::string> removed = remove_stale_staging(dir_);
  std::sort(removed.begin(), removed.end());
  EXPECT_THAT(removed, ElementsAre(named, old_style));
  EXPECT_FALSE(fs::exists(named));
  EXPECT_FALSE(fs::exists(old_style));
  EXPECT_EQ(zombie.state(), 'Z') << "the test reaped the owner too early";
}

// Note [Who owns a staging directory]: a running process whose start time
// is not the one recorded got the owner's pid after the owner exited.
TEST_F(CheckpointDirTest, StagingFolderWhosePidWasReusedIsRemovedAndTheOwnersOwnIsKept) {
  std::string staging;
  {
    CheckpointWriter writer = CheckpointWriter::begin(path("probe"));
    staging = writer.staging_dir();
    // A save records its owner's start time.
    const std::string owner = read_bytes(staging + "/" + kStagingOwner);
    EXPECT_THAT(owner, ::testing::EndsWith("\npid " + std::to_string(::getpid()) + "\nstart " + own_start_time() +
                                           "\n"));
  }
  const std::string host_tag = staging.substr(staging.rfind('@') + 1);
  char name[256] = {0};
  ::gethostname(name, sizeof(name) - 1);
  const std::string pid = std::to_string(::getpid());  // runs, but is not the recorded owner
  auto make = [&](const std::string& folder, const std::string& start_line) {
    fs::create_directory(path(folder));
    write_bytes(path(folder + "/" + kStagingOwner), "host " + std::string(name) + "\npid " + pid + "\n" + start_line);
    return path(folder);
  };
  const std::string reused = make("step-1.tmp-" + pid + "-0@" + host_tag, "start 1\n");
  const std::string reused_old_style = make("step-2.tmp-" + pid + "-1", "start 1\n");
  const std::string mine = make("step-3.tmp-" + pid + "-2@" + host_tag, "start " + own_start_time() + "\n");
  const std::string unrecorded = make("step-4.tmp-" + pid + "-3@" + host_tag, "");  // older strata
  const std::string garbled = make("step-5.tmp-" + pid + "-4", "start soon\n");
  std::vector<std::string> removed = remove_stale_staging(dir_);
  std::sort(removed.begin(), removed.end());
  EXPECT_THAT(removed, ElementsAre(reused, reused_old_style));
  for (const std::string& kept : {mine, unrecorded, garbled}) EXPECT_TRUE(fs::exists(kept)) << kept;
}

}  // namespace
}  // namespace strata::checkpoint
