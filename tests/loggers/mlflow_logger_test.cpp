// The MLflow logger against a real tracking server: `mlflow server`
// (scripts/requirements-mlflow.txt, its own venv) started on loopback with a
// sqlite store in a temp folder, the run read back with MLflow's own client
// (read_mlflow.py: MlflowClient.get_run, get_metric_history) and compared
// with a CSVLogger of the same fit. Also: a server that is down and one that
// accepts connections but never answers leave training undisturbed, warn
// once and finalize within its bound; Lightning's key rules; the option
// checks.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <thread>

#include "cli/train_job.h"
#include "strata/core/error.h"
#include "strata/loggers/csv_logger.h"
#include "strata/loggers/mlflow_logger.h"
#include "support/tool.h"
#include "test_paths.h"
#include "trainer/trainer_util.h"

namespace {

using namespace strata::testing;
using strata::trainer::MLFlowLogger;
using strata::trainer::MLFlowOptions;
using nlohmann::json;
namespace fs = std::filesystem;

std::string run_command(const std::string& command, int& code) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) {
    code = -1;
    return "popen failed";
  }
  std::string output;
  std::array<char, 4096> buffer;
  while (size_t n = std::fread(buffer.data(), 1, buffer.size(), pipe)) output.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return output;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A loopback socket bound to a free port; listening or not.
struct LoopbackSocket {
  int fd = -1;
  int port = 0;
  explicit LoopbackSocket(bool listening) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    socklen_t len = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
    if (listening) EXPECT_EQ(::listen(fd, 16), 0);
  }
  ~LoopbackSocket() { close(); }
  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

// A port nothing listens on (bound, then released).
int free_port() {
  LoopbackSocket s(false);
  return s.port;
}

// GET http://127.0.0.1:port/path over a plain socket; the status line's
// code, or 0 when nothing answered within `timeout_s`.
int http_status(int port, const std::string& path, int timeout_s = 2) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{timeout_s, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  int code = 0;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
      char buf[64] = {};
      const ssize_t n = ::recv(fd, buf, sizeof buf - 1, 0);
      if (n > 12 && std::string(buf, 5) == "HTTP/") code = std::atoi(buf + 9);
    }
  }
  ::close(fd);
  return code;
}

const char* mlflow_python() { return STRATA_TEST_MLFLOW_PYTHON; }

// `mlflow server` on 127.0.0.1 for a test: started by a watcher process
// that leads their process group and kills the whole group (the server and
// any worker it starts) when the test closes its pipe or dies, so a failed
// or crashed test leaves no server behind.
class MLflowServer {
 public:
  MLflowServer() : dir_("mlflow-server") {}
  ~MLflowServer() { stop(); }

  // "" when up, else why not (with the server's log).
  std::string start() {
    const std::string python = mlflow_python();
    if (python.empty() || !fs::exists(python)) {
      return "the MLflow venv's Python ('" + python +
             "') is missing: run scripts/install-deps.sh (it installs scripts/requirements-mlflow.txt) and "
             "configure the build again";
    }
    port_ = free_port();
    log_ = dir_.path + "/server.log";
    const std::vector<std::string> argv{python, "-m", "mlflow", "server", "--host", "127.0.0.1",
                                        "--port", std::to_string(port_), "--workers", "1",
                                        "--backend-store-uri", "sqlite:///" + dir_.path + "/mlflow.db",
                                        "--default-artifact-root", dir_.path + "/artifacts"};
    // Everything the children need is made before fork: they only call
    // async-signal-safe functions.
    std::vector<char*> cargv;
    for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    const int log_fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int alive[2];
    if (log_fd < 0 || ::pipe2(alive, O_CLOEXEC) != 0) return "cannot make the server's log file or pipe";
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::close(alive[1]);
      const pid_t server = ::fork();
      if (server == 0) {
        ::dup2(log_fd, 1);
        ::dup2(log_fd, 2);
        ::execv(cargv[0], cargv.data());
        ::_exit(127);
      }
      // The watcher: until the test closes the pipe (or dies), or the server exits.
      while (true) {
        pollfd p{alive[0], POLLIN, 0};
        if (::poll(&p, 1, 200) > 0) break;  // EOF: the test is done with the server
        if (::waitpid(server, nullptr, WNOHANG) == server) ::_exit(1);
      }
      ::kill(-::getpgrp(), SIGKILL);
      ::_exit(0);
    }
    ::close(alive[0]);
    ::close(log_fd);
    alive_ = alive[1];
    ::setpgid(pid_, pid_);
    // Bounded: the server answers /health within 3 minutes or the test fails.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(3);
    while (std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        stop();
        return "mlflow server exited before answering; its log:\n" + read_text(log_);
      }
      if (http_status(port_, "/health") == 200) {
        // The first API call of a fresh server sets up its store (seconds on
        // a busy machine): made here, so the tests' requests find it ready.
        if (http_status(port_, "/api/2.0/mlflow/experiments/get-by-name?experiment_name=Default", 120) == 200) {
          return "";
        }
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    stop();
    return "mlflow server did not answer /health and its first API call within 3 minutes; its log:\n" +
           read_text(log_);
  }

  void stop() {
    if (alive_ >= 0) ::close(alive_);  // the watcher kills the group
    alive_ = -1;
    if (pid_ > 0) {
      ::waitpid(pid_, nullptr, 0);
      ::kill(-pid_, SIGKILL);  // in case the watcher went first
    }
    pid_ = -1;
  }

  std::string uri() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string log() const { return read_text(log_); }

 private:
  TempDir dir_;
  pid_t pid_ = -1;
  int alive_ = -1;
  int port_ = 0;
  std::string log_;
};

// Reads a run back with MLflow's client (read_mlflow.py).
json read_run(const std::string& uri, const std::string& select, const std::string& csv = "") {
  int code = 0;
  const std::string command = std::string(mlflow_python()) + " " + STRATA_TEST_SOURCE_DIR +
                              "/tests/loggers/read_mlflow.py " + uri + " " + select +
                              (csv.empty() ? "" : " --csv " + csv);
  const std::string out = run_command(command, code);
  EXPECT_EQ(code, 0) << command << "\n" << out;
  if (code != 0) return json();
  // The last line is the JSON; MLflow may print notices before it.
  const size_t line = out.rfind("\n{");
  const json parsed = json::parse(out.substr(line == std::string::npos ? 0 : line + 1), nullptr, false);
  EXPECT_FALSE(parsed.is_discarded()) << out;
  return parsed.is_discarded() ? json() : parsed;
}

// [[step, value], ...] without repeats: the server keeps one copy of a
// metric logged twice with the same step, value and millisecond.
json unique_points(const json& points) {
  std::vector<json> v(points.begin(), points.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return json(v);
}

/// Logs known values per step and per epoch, and validates.
class Known : public strata::TrainModule {
 public:
  Known() { linear = register_module("linear", torch::nn::Linear(1, 1)); }
  at::Tensor training_step(const strata::data::Batch& b, int64_t) override {
    log("a", static_cast<double>(global_step()) + 0.25, strata::LogOptions().with_on_epoch(true));
    at::Tensor loss = (linear->forward(b.input) - b.target).pow(2).mean() * 1e-3;
    log("train_loss", loss);
    return loss;
  }
  at::Tensor validation_step(const strata::data::Batch& b, int64_t) override {
    log("val_x", b.input.mean());
    return {};
  }
  strata::OptimizerConfig configure_optimizers() override {
    return strata::OptimizerConfig(std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01)));
  }
  torch::nn::Linear linear{nullptr};
};

strata::trainer::Hyperparams typed_hparams() {
  return {{"lr", 0.01},
          {"compile", false},
          {"optimizer", "AdamW"},
          {"none", nullptr},
          {"betas", {0.9, 0.95}},
          {"empty", json::object()},
          {"model", {{"n_layer", 2}, {"act", "gelu"}, {"dims", {{"embd", 64}}}}}};
}

// Fits Known for two epochs of two steps with `loggers`.
void fit_known(const std::vector<strata::trainer::LoggerPtr>& loggers) {
  strata::TrainerOptions options;
  options.with_max_epochs(2).with_log_every_n_steps(1).with_enable_progress_bar(false).with_enable_checkpointing(false);
  for (const auto& l : loggers) options.with_logger(l);
  strata::Trainer trainer(options);
  auto module = std::make_shared<Known>();
  module->save_hyperparameters(typed_hparams());
  auto data = strata::DataSource(index_dataset(8), strata::DataOptions().with_batch_size(4));
  trainer.fit(module, data, data);
}

class MLFlowServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ::setenv("NO_PROXY", "127.0.0.1,localhost", 1);
    ::setenv("no_proxy", "127.0.0.1,localhost", 1);
    server_ = new MLflowServer();
    error_ = server_->start();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(error_.empty()) << error_; }

  static MLflowServer* server_;
  static std::string error_;
};
MLflowServer* MLFlowServerTest::server_ = nullptr;
std::string MLFlowServerTest::error_;

// The acceptance test: a Trainer fit with an MLFlowLogger and a CSVLogger
// side by side; MLflow's client reads back the typed hyperparameters
// flattened as Lightning flattens them, every metric's steps and values
// equal to the CSV's, the tags, the run name and the status FINISHED.
TEST_F(MLFlowServerTest, TrainerRunReadsBackLikeTheCsvLogger) {
  TempDir dir("mlflow-fit");
  auto csv = std::make_shared<strata::trainer::CSVLogger>(dir.path, "run");
  // Generous bounds: everything must arrive, even on a busy machine
  // (finalize returns as soon as it has).
  auto mlflow = std::make_shared<MLFlowLogger>(MLFlowOptions()
                                                   .with_tracking_uri(server_->uri())
                                                   .with_request_timeout_s(60)
                                                   .with_finalize_timeout_s(120)
                                                   .with_experiment_name("strata-tests")
                                                   .with_run_name("known-fit")
                                                   .with_tags({{"team", "nlp"}, {"data", "index"}}));
  fit_known({mlflow, csv});
  const strata::trainer::MLFlowReport report = mlflow->report();
  ASSERT_FALSE(report.run_id.empty()) << report.last_error << "\nserver log:\n" << server_->log();
  EXPECT_TRUE(report.terminated) << report.last_error;
  EXPECT_EQ(report.pending, 0);
  EXPECT_EQ(report.dropped_full + report.given_up, 0) << report.last_error;
  EXPECT_FALSE(report.unreachable_warned) << report.last_error;

  const json run = read_run(server_->uri(), "--run-id " + report.run_id, csv->metrics_file());
  ASSERT_TRUE(run.is_object());
  EXPECT_EQ(run["status"], "FINISHED");
  EXPECT_EQ(run["run_name"], "known-fit");
  EXPECT_EQ(run["experiment"], "strata-tests");
  EXPECT_EQ(run["params"], json({{"lr", "0.01"},
                                 {"compile", "False"},
                                 {"optimizer", "AdamW"},
                                 {"none", "None"},
                                 {"betas", "[0.9, 0.95]"},
                                 {"model/n_layer", "2"},
                                 {"model/act", "gelu"},
                                 {"model/dims/embd", "64"}}));
  EXPECT_EQ(run["tags"]["team"], "nlp");
  EXPECT_EQ(run["tags"]["data"], "index");
  EXPECT_EQ(run["tags"]["mlflow.runName"], "known-fit");
  EXPECT_EQ(run["tags"]["mlflow.source.name"], "strata");
  // Every metric, with the CSV's steps and values.
  const json& csv_metrics = run["csv"];
  std::set<std::string> csv_keys, mlflow_keys;
  for (auto it = csv_metrics.begin(); it != csv_metrics.end(); ++it) csv_keys.insert(it.key());
  for (auto it = run["metrics"].begin(); it != run["metrics"].end(); ++it) mlflow_keys.insert(it.key());
  EXPECT_EQ(mlflow_keys, csv_keys);
  EXPECT_EQ(csv_keys, (std::set<std::string>{"a_epoch", "a_step", "epoch", "train_loss", "val_x"}));
  for (const std::string& key : csv_keys) {
    EXPECT_EQ(unique_points(run["metrics"][key]), unique_points(csv_metrics[key])) << key;
  }
  EXPECT_EQ(run["metrics"]["a_step"], json({{0, 0.25}, {1, 1.25}, {2, 2.25}, {3, 3.25}}));

  // Continuing the run (run_id): a changed param is refused by the server
  // (its batch is dropped, with the server's reason in one warning) and
  // "failed" ends the run FAILED.
  ::testing::internal::CaptureStderr();
  {
    MLFlowLogger again(MLFlowOptions()
                           .with_tracking_uri(server_->uri())
                           .with_run_id(report.run_id)
                           .with_request_timeout_s(60)
                           .with_finalize_timeout_s(120));
    again.log_hyperparams({{"lr", 0.5}});
    again.log_metrics({{"extra", 1.0}}, 10);
    again.finalize("failed");
    const strata::trainer::MLFlowReport r = again.report();
    EXPECT_EQ(r.given_up, 2) << r.last_error;
    EXPECT_TRUE(r.terminated) << r.last_error;
    EXPECT_EQ(r.experiment_id, report.experiment_id);
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("refused 2 entries (HTTP 400 INVALID_PARAMETER_VALUE: Changing param values is not allowed"),
            std::string::npos)
      << err;
  const json continued = read_run(server_->uri(), "--run-id " + report.run_id);
  ASSERT_TRUE(continued.is_object());
  EXPECT_EQ(continued["status"], "FAILED");
  EXPECT_EQ(continued["params"]["lr"], "0.01");
  EXPECT_FALSE(continued["metrics"].contains("extra"));
}

// `strata train --logger csv,mlflow` against the server: the run is named
// after the version folder, holds strata train's configuration as params
// and the CSV's train_loss, and ends FINISHED.
TEST_F(MLFlowServerTest, StrataTrainLogsToTheServer) {
  if (!fs::exists(strata_binary())) GTEST_SKIP() << "the strata tool is not built (" << strata_binary() << ")";
  TempDir dir("mlflow-cli");
  Outcome o = finish(start_strata({"train", "--devices", "1", "--strategy", "single_device", "--model-size", "tiny",
                                   "--max-steps", "3", "--batch-size", "4", "--sample-tokens", "0", "--val-every", "0",
                                   "--log-every", "1", "--logger", "csv,mlflow", "--log-dir", dir.path + "/runs",
                                   "--mlflow-uri", server_->uri(), "--mlflow-experiment", "strata-cli"}));
  ASSERT_EQ(o.status, 0) << o.out << o.err;
  EXPECT_EQ(o.err.find("warning: [mlflow]"), std::string::npos) << o.err;
  const json run = read_run(server_->uri(), "--experiment strata-cli --run-name train/version_0",
                            dir.path + "/runs/train/version_0/metrics.csv");
  ASSERT_TRUE(run.is_object());
  EXPECT_EQ(run["status"], "FINISHED");
  EXPECT_EQ(run["params"]["model_size"], "tiny");
  EXPECT_EQ(run["params"]["lr"], "0.002");
  EXPECT_EQ(run["params"]["max_steps"], "3");
  EXPECT_EQ(run["params"]["strategy"], "single_device");
  EXPECT_EQ(run["params"]["model_config/n_layer"], "2");
  ASSERT_TRUE(run["csv"].contains("train_loss")) << run.dump();
  EXPECT_EQ(run["csv"]["train_loss"].size(), 3u);
  for (auto it = run["csv"].begin(); it != run["csv"].end(); ++it) {
    EXPECT_EQ(unique_points(run["metrics"][it.key()]), unique_points(it.value())) << it.key();
  }
}

// Options for the unreachable servers: short timeouts so the test is quick.
MLFlowOptions unreachable_options(int port) {
  ::setenv("NO_PROXY", "127.0.0.1,localhost", 1);  // loopback, never through a proxy
  ::setenv("no_proxy", "127.0.0.1,localhost", 1);
  return MLFlowOptions()
      .with_tracking_uri("http://127.0.0.1:" + std::to_string(port))
      .with_request_timeout_s(0.5)
      .with_finalize_timeout_s(1.0)
      .with_backoff_s(0.05, 0.2);
}

// Fits with the logger while stderr is captured; what was printed.
// Stderr is captured from before the logger exists: its sender may warn
// as soon as it starts, before the fit logs anything.
std::string fit_with_unreachable(const MLFlowOptions& options, std::shared_ptr<MLFlowLogger>& logger,
                                 double& finalize_s) {
  ::testing::internal::CaptureStderr();
  logger = std::make_shared<MLFlowLogger>(options);
  fit_known({logger});
  // finalize again, timed: the fit's own finalize already ran.
  const auto start = std::chrono::steady_clock::now();
  logger->finalize("success");
  finalize_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return ::testing::internal::GetCapturedStderr();
}

void expect_unsent(const std::string& err, const strata::trainer::MLFlowReport& report) {
  EXPECT_EQ(count_of(err, "no usable answer from the tracking server"), 1u) << err;           // one warning, not one per step
  EXPECT_EQ(count_of(err, "waited 1 s (finalize_timeout_s)"), 2u) << err;  // each finalize says what is left
  EXPECT_NE(err.find("metric, 8 param and 0 tag entries are not sent yet"), std::string::npos) << err;
  EXPECT_TRUE(report.run_id.empty());
  EXPECT_FALSE(report.terminated);
  EXPECT_TRUE(report.unreachable_warned);
  EXPECT_EQ(report.sent, 0);
  EXPECT_GT(report.pending, 8);  // the params, the metrics and the two end statuses
}

// Nothing listens on the port: fit completes, one warning, finalize returns
// after its bound and says what was not sent.
TEST(MLFlowLoggerTest, ServerDownDoesNotStopTraining) {
  std::shared_ptr<MLFlowLogger> logger;
  double finalize_s = 0;
  const std::string err = fit_with_unreachable(unreachable_options(free_port()), logger, finalize_s);
  expect_unsent(err, logger->report());
  EXPECT_NE(logger->report().last_error.find("onnect"), std::string::npos) << logger->report().last_error;
  // A bound far above finalize_timeout_s: catches a hang, not a slow machine.
  EXPECT_LT(finalize_s, 30.0);
}

// A socket that accepts connections (the kernel completes them from the
// backlog) and never answers: every request runs into its timeout.
TEST(MLFlowLoggerTest, ServerThatNeverAnswersDoesNotStopTraining) {
  LoopbackSocket silent(/*listening=*/true);
  std::shared_ptr<MLFlowLogger> logger;
  double finalize_s = 0;
  const std::string err = fit_with_unreachable(unreachable_options(silent.port), logger, finalize_s);
  expect_unsent(err, logger->report());
  EXPECT_NE(logger->report().last_error.find("imeout"), std::string::npos) << logger->report().last_error;
  EXPECT_LT(finalize_s, 30.0);
  // The destructor cuts off the request in flight instead of waiting for it.
  const auto start = std::chrono::steady_clock::now();
  logger.reset();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
}

// The queue is bounded: past max_queued the oldest entries go, counted.
TEST(MLFlowLoggerTest, FullQueueDropsTheOldestAndSaysSo) {
  MLFlowOptions options = unreachable_options(free_port());
  options.with_max_queued(5);
  ::testing::internal::CaptureStderr();
  {
    MLFlowLogger logger(options);
    for (int step = 0; step < 4; ++step) logger.log_metrics({{"a", 1.0}, {"b", 2.0}, {"c", 3.0}}, step);
    const strata::trainer::MLFlowReport report = logger.report();
    EXPECT_EQ(report.dropped_full, 7);
    EXPECT_EQ(report.pending, 5);
    logger.finalize("success");
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_of(err, "the most the queue holds (max_queued)"), 1u) << err;
  EXPECT_NE(err.find("were dropped when the queue was full"), std::string::npos) << err;
}

// Lightning's _flatten_dict and str() of each value; values cut at 250.
TEST(MLFlowKeysTest, ParamsAreFlattenedAsLightningDoes) {
  const auto params = strata::trainer::mlflow_params(typed_hparams());
  const std::vector<std::pair<std::string, std::string>> want{
      {"betas", "[0.9, 0.95]"}, {"compile", "False"},    {"lr", "0.01"},
      {"model/act", "gelu"},    {"model/dims/embd", "64"}, {"model/n_layer", "2"},
      {"none", "None"},         {"optimizer", "AdamW"}};
  EXPECT_EQ(params, want);
  const auto floats = strata::trainer::mlflow_params({{"small", 1e-5}, {"whole", 3.0}, {"big", 1e16}, {"t", true}});
  EXPECT_EQ(floats, (std::vector<std::pair<std::string, std::string>>{
                        {"big", "1e+16"}, {"small", "1e-05"}, {"t", "True"}, {"whole", "3.0"}}));
  // Cut at 250 characters, counted as Python counts them (code points).
  std::string long_text;
  for (int i = 0; i < 300; ++i) long_text += "\xC3\xA9";  // é
  const auto cut = strata::trainer::mlflow_params({{"text", long_text}, {"list", json::array({"x"})}});
  EXPECT_EQ(cut[0], (std::pair<std::string, std::string>{"list", "['x']"}));
  EXPECT_EQ(cut[1].second, long_text.substr(0, 500));
}

TEST(MLFlowKeysTest, MetricNamesKeepWhatMlflowAllows) {
  using strata::trainer::mlflow_metric_key;
  EXPECT_EQ(mlflow_metric_key("lr-AdamW"), "lr-AdamW");
  EXPECT_EQ(mlflow_metric_key("val/acc top.1 x_y"), "val/acc top.1 x_y");
  EXPECT_EQ(mlflow_metric_key("val/acc@1"), "val/acc1");
  EXPECT_EQ(mlflow_metric_key("loss(%)[0]"), "loss0");
  EXPECT_EQ(mlflow_metric_key("h\xC3\xA9llo"), "hllo");
}

TEST(MLFlowLoggerTest, RefusesBadOptions) {
  auto message = [](MLFlowOptions o) -> std::string {
    try {
      MLFlowLogger logger(std::move(o));
    } catch (const strata::ConfigError& e) {
      return e.what();
    }
    return "no error";
  };
  const char* saved = std::getenv("MLFLOW_TRACKING_URI");
  const std::string saved_uri = saved ? saved : "";
  ::unsetenv("MLFLOW_TRACKING_URI");
  EXPECT_NE(message(MLFlowOptions()).find("no tracking server: pass tracking_uri"), std::string::npos);
  EXPECT_NE(message(MLFlowOptions().with_tracking_uri("file:./mlruns")).find("is not an http:// or https:// address"),
            std::string::npos);
  EXPECT_NE(message(MLFlowOptions().with_tracking_uri("http://a b")).find("holds a space"), std::string::npos);
  EXPECT_NE(message(MLFlowOptions().with_tracking_uri("http://127.0.0.1:1").with_request_timeout_s(0))
                .find("request_timeout_s must be a number of seconds in (0, 3600], got 0"),
            std::string::npos);
  EXPECT_NE(message(MLFlowOptions().with_tracking_uri("http://127.0.0.1:1").with_max_queued(0))
                .find("max_queued must be in 1..100000000, got 0"),
            std::string::npos);
  ::setenv("MLFLOW_TRACKING_URI", "ftp://x", 1);
  EXPECT_NE(message(MLFlowOptions()).find("MLFLOW_TRACKING_URI 'ftp://x' is not an http://"), std::string::npos);
  ::setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1", 1);
  ::setenv("MLFLOW_TRACKING_TOKEN", "abc\r\nX-Evil: 1", 1);
  EXPECT_NE(message(MLFlowOptions()).find("MLFLOW_TRACKING_TOKEN holds a line break"), std::string::npos);
  ::unsetenv("MLFLOW_TRACKING_TOKEN");
  ::setenv("MLFLOW_TRACKING_USERNAME", "me", 1);
  EXPECT_NE(message(MLFlowOptions()).find("go together"), std::string::npos);
  ::unsetenv("MLFLOW_TRACKING_USERNAME");
  if (saved_uri.empty()) ::unsetenv("MLFLOW_TRACKING_URI");
  else ::setenv("MLFLOW_TRACKING_URI", saved_uri.c_str(), 1);
}

// strata train's flags: --logger mlflow needs an http(s) server address
// (checked before any worker starts), the mlflow flags need the logger,
// and rank 0 gets an MLFlowLogger named after the version folder.
TEST(MLFlowLoggerTest, StrataTrainChecksItsMlflowFlags) {
  auto message = [](const strata::cli::TrainConfig& c) -> std::string {
    try {
      c.validate();
    } catch (const strata::ConfigError& e) {
      return e.what();
    }
    return "no error";
  };
  const char* saved = std::getenv("MLFLOW_TRACKING_URI");
  const std::string saved_uri = saved ? saved : "";
  ::unsetenv("MLFLOW_TRACKING_URI");
  TempDir dir("mlflow-flags");
  strata::cli::TrainConfig c;
  c.log_dir = dir.path;
  c.logger = "csv,mlflow";
  EXPECT_NE(message(c).find("--logger mlflow needs a tracking server: pass --mlflow-uri"), std::string::npos)
      << message(c);
  c.mlflow_uri = "file:./mlruns";
  EXPECT_NE(message(c).find("--mlflow-uri 'file:./mlruns' is not an http:// or https:// address"), std::string::npos)
      << message(c);
  c.mlflow_uri = "http://127.0.0.1:1";
  EXPECT_EQ(message(c), "no error");
  {
    const strata::TrainerOptions o = strata::cli::trainer_options(c, /*rank_zero=*/true);
    ASSERT_EQ(o.loggers.size(), 2u);
    EXPECT_EQ(o.loggers[0]->name(), "csv");
    EXPECT_EQ(o.loggers[1]->name(), "mlflow");
    EXPECT_EQ(std::dynamic_pointer_cast<MLFlowLogger>(o.loggers[1])->tracking_uri(), "http://127.0.0.1:1");
    EXPECT_TRUE(strata::cli::trainer_options(c, /*rank_zero=*/false).loggers.empty());
  }
  c.logger = "csv";
  EXPECT_NE(message(c).find("--mlflow-uri applies only to --logger mlflow"), std::string::npos) << message(c);
  c.mlflow_uri.clear();
  c.logger = "mlflow";
  ::setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1", 1);
  EXPECT_EQ(message(c), "no error");
  if (saved_uri.empty()) ::unsetenv("MLFLOW_TRACKING_URI");
  else ::setenv("MLFLOW_TRACKING_URI", saved_uri.c_str(), 1);
}

}  // namespace
