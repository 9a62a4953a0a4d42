// The MLflow logger's HTTP client: one libcurl connection, GET or POST of
// JSON, every request bounded in time and in the size of its answer, and
// cut off when the logger shuts down. Only mlflow_http.cpp sees curl.h
// (CMake defines STRATA_HAVE_CURL there when libcurl was found); without
// libcurl it builds a client whose every request fails, and
// http_client_built() says so, which MLFlowLogger's constructor checks.
#pragma once

#include <atomic>
#include <memory>
#include <string>

namespace strata::trainer::detail {

/// Whether strata was built with libcurl (else no request can succeed).
bool http_client_built();

/// What one request came to.
struct HttpResponse {
  long status = 0;        ///< HTTP status; 0 when no answer came
  std::string body;
  std::string failure;    ///< why the request failed ("" when it got an answer)
  bool cut_off = false;   ///< the logger is shutting down
};

/// How the client proves who it is to the server and checks the server
/// (MLflow's MLFLOW_TRACKING_* variables).
struct HttpAuth {
  std::string token;     ///< a bearer token; over user/password when both are set
  std::string user;      ///< basic authentication, with password
  std::string password;
  std::string ca_file;   ///< certificates to check the server with ("" : the system's)
  bool insecure = false; ///< skip the TLS checks
};

/// One connection to the server, used by one thread alone.
class HttpClient {
 public:
  /// `abort` (kept by the caller, outliving the client) cuts off a
  /// request in flight when it turns true. Throws Error when libcurl
  /// cannot start.
  HttpClient(const HttpAuth& auth, const std::atomic<bool>* abort);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  /// GET `url` when `body` is empty, else POST `body` as JSON, within
  /// `timeout_s` (connecting included). Never throws for the network:
  /// the failure is in the response.
  HttpResponse request(const std::string& url, const std::string& body, double timeout_s);
  /// `text` escaped for a URL's query.
  std::string escape(const std::string& text);

 private:
  struct Handle;
  std::unique_ptr<Handle> handle_;
};

}  // namespace strata::trainer::detail
