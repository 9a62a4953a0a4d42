// The MLflow logger's HTTP client over libcurl (mlflow_http.h).
#include "mlflow_http.h"

#include <algorithm>
#include <mutex>

#include "strata/core/error.h"

#if STRATA_HAVE_CURL
#include <curl/curl.h>
#endif

namespace strata::trainer::detail {

#if STRATA_HAVE_CURL

namespace {

// The most of an answer strata reads.
constexpr std::size_t kMaxResponseBytes = 1 << 20;

void init_curl_once() {
  static std::once_flag once;
  static CURLcode code = CURLE_OK;
  std::call_once(once, [] { code = curl_global_init(CURL_GLOBAL_DEFAULT); });
  STRATA_CHECK(code == CURLE_OK, Error, "[mlflow] libcurl failed to initialise: ", curl_easy_strerror(code));
}

struct Body {
  std::string text;
  bool too_long = false;
};

size_t write_body(char* data, size_t size, size_t count, void* user) {
  Body& body = *static_cast<Body*>(user);
  const size_t n = size * count;
  if (body.text.size() + n > kMaxResponseBytes) {
    body.too_long = true;
    return 0;  // curl stops with CURLE_WRITE_ERROR
  }
  body.text.append(data, n);
  return n;
}

int check_abort(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return static_cast<const std::atomic<bool>*>(user)->load() ? 1 : 0;
}

}  // namespace

bool http_client_built() { return true; }

struct HttpClient::Handle {
  CURL* curl = nullptr;
  curl_slist* headers = nullptr;
  ~Handle() {
    curl_easy_cleanup(curl);
    curl_slist_free_all(headers);
  }
};

HttpClient::HttpClient(const HttpAuth& auth, const std::atomic<bool>* abort) : handle_(std::make_unique<Handle>()) {
  init_curl_once();
  CURL* curl = handle_->curl = curl_easy_init();
  STRATA_CHECK(curl != nullptr, Error, "[mlflow] libcurl could not make a handle (out of memory?)");
  curl_slist*& headers = handle_->headers;
  headers = curl_slist_append(headers, "Content-Type: application/json");
  headers = curl_slist_append(headers, "Expect:");
  if (!auth.token.empty()) headers = curl_slist_append(headers, ("Authorization: Bearer " + auth.token).c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
#if LIBCURL_VERSION_NUM >= 0x075500
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
#endif
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, write_body);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, check_abort);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, abort);
  curl_easy_setopt(curl, CURLOPT_USERAGENT, "strata-mlflow-logger");
  if (auth.token.empty() && !auth.user.empty()) {
    curl_easy_setopt(curl, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
    curl_easy_setopt(curl, CURLOPT_USERNAME, auth.user.c_str());
    curl_easy_setopt(curl, CURLOPT_PASSWORD, auth.password.c_str());
  }
  if (auth.insecure) {
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  if (!auth.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, auth.ca_file.c_str());
}

HttpClient::~HttpClient() = default;

HttpResponse HttpClient::request(const std::string& url, const std::string& body, double timeout_s) {
  CURL* curl = handle_->curl;
  Body answer;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &answer);
  const long timeout_ms = std::max(1L, static_cast<long>(timeout_s * 1000));
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
  if (body.empty()) {
    curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
  } else {
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  const CURLcode code = curl_easy_perform(curl);
  HttpResponse r;
  if (code != CURLE_OK) {
    r.cut_off = code == CURLE_ABORTED_BY_CALLBACK;
    r.failure = answer.too_long ? "the answer is over " + std::to_string(kMaxResponseBytes) + " bytes"
                                : std::string(curl_easy_strerror(code));
    return r;
  }
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r.status);
  r.body = std::move(answer.text);
  return r;
}

std::string HttpClient::escape(const std::string& text) {
  char* e = curl_easy_escape(handle_->curl, text.c_str(), static_cast<int>(text.size()));
  std::string out = e ? e : "";
  curl_free(e);
  return out;
}

#else  // no libcurl: MLFlowLogger's constructor refuses before any of this runs

bool http_client_built() { return false; }

struct HttpClient::Handle {};

HttpClient::HttpClient(const HttpAuth&, const std::atomic<bool>*) {}

HttpClient::~HttpClient() = default;

HttpResponse HttpClient::request(const std::string&, const std::string&, double) {
  HttpResponse r;
  r.failure = "strata was built without libcurl";
  return r;
}

std::string HttpClient::escape(const std::string& text) { return text; }

#endif

}  // namespace strata::trainer::detail
