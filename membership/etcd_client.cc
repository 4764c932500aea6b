// EtcdClient / EtcdWatch over etcd's v3 JSON gateway with libcurl (see etcd_client.h).
#include "membership/etcd_client.h"

#include <curl/curl.h>

#include <chrono>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/logging.h"

namespace tessera::membership {
namespace {

using json = nlohmann::json;

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// ---- base64 (etcd's gateway encodes keys and values as standard base64) ----
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string B64Encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (i + 1 == in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

Result<std::string> B64Decode(std::string_view in) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (in.size() % 4 != 0) return ProtocolError("etcd: bad base64 length ", in.size());
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    int a = val(in[i]), b = val(in[i + 1]);
    if (a < 0 || b < 0) return ProtocolError("etcd: bad base64");
    out += static_cast<char>((a << 2) | (b >> 4));
    if (in[i + 2] == '=') break;
    int c = val(in[i + 2]);
    if (c < 0) return ProtocolError("etcd: bad base64");
    out += static_cast<char>(((b & 15) << 4) | (c >> 2));
    if (in[i + 3] == '=') break;
    int d = val(in[i + 3]);
    if (d < 0) return ProtocolError("etcd: bad base64");
    out += static_cast<char>(((c & 3) << 6) | d);
  }
  return out;
}

// int64 fields arrive as decimal strings (proto3 JSON); absent means 0.
int64_t Int(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    try {
      return std::stoll(it->get<std::string>());
    } catch (...) {
      return 0;
    }
  }
  return 0;
}

Result<KeyValue> ParseKv(const json& j) {
  KeyValue kv;
  TESSERA_ASSIGN_OR_RETURN(kv.key, B64Decode(j.value("key", std::string())));
  TESSERA_ASSIGN_OR_RETURN(kv.value, B64Decode(j.value("value", std::string())));
  kv.create_revision = Int(j, "create_revision");
  kv.mod_revision = Int(j, "mod_revision");
  kv.lease = Int(j, "lease");
  return kv;
}

Result<json> ParseJson(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return ProtocolError("etcd: reply is not a JSON object: ", text.substr(0, 200));
  }
  // Gateway errors: {"error": "...", "message": "...", "code": N}.
  if (j.contains("error") && !j.contains("result")) {
    std::string msg = j.value("message", j["error"].is_string() ? j["error"].get<std::string>()
                                                                : std::string("error"));
    const int code = j.value("code", 0);
    if (code == 5) return NotFound("etcd: ", msg);               // NOT_FOUND
    if (code == 14 || code == 4) return Unavailable("etcd: ", msg);  // UNAVAILABLE, DEADLINE
    return Internal("etcd: ", msg, " (grpc code ", code, ")");
  }
  return j;
}

std::string Normalize(std::string e) {
  if (e.find("://") == std::string::npos) e = "http://" + e;
  while (!e.empty() && e.back() == '/') e.pop_back();
  return e;
}

size_t AppendBody(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

// Points `h` at a JSON POST of `body` to `url` whose reply goes to write(data): the options a
// unary call and the watch stream share (no proxy, no signals, bounded connect). Returns the
// header list, which the caller frees after the transfer; `err` (CURL_ERROR_SIZE) gets
// libcurl's message. `url` and `body` must outlive the transfer.
using CurlWrite = size_t (*)(char*, size_t, size_t, void*);
curl_slist* SetUpJsonPost(CURL* h, const std::string& url, const std::string& body,
                          CurlWrite write, void* data, char* err, uint32_t connect_timeout_ms) {
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, data);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, err);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(connect_timeout_ms));
  return headers;
}

}  // namespace

std::string PrefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    if (static_cast<uint8_t>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<uint8_t>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

std::vector<std::string> SingleEtcdArgs(const std::string& name, const std::string& data_dir,
                                        int client_port, int peer_port,
                                        const std::string& log_path) {
  const std::string client = "http://127.0.0.1:" + std::to_string(client_port);
  const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port);
  return {"etcd",
          "--name=" + name,
          "--data-dir=" + data_dir,
          "--listen-client-urls=" + client,
          "--advertise-client-urls=" + client,
          "--listen-peer-urls=" + peer,
          "--initial-advertise-peer-urls=" + peer,
          "--initial-cluster=" + name + "=" + peer,
          "--logger=zap",
          "--log-outputs=" + log_path};
}

Status WaitForEtcd(const std::string& endpoint, int timeout_ms,
                   const std::function<bool()>& exited) {
  EtcdOptions o;
  o.endpoints = {endpoint};
  o.connect_timeout_ms = 200;
  o.request_timeout_ms = 500;
  TESSERA_ASSIGN_OR_RETURN(auto c, EtcdClient::Create(o));
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  Status st;
  while (std::chrono::steady_clock::now() < until) {
    if (exited()) return Unavailable("etcd exited at start");
    auto r = c->Get("/health-probe");
    if (r.ok()) return Status::Ok();
    st = r.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(30));  // Poll interval, not a sync.
  }
  return Timeout("etcd did not answer within ", timeout_ms, " ms: ", st.ToString());
}

Result<std::vector<std::string>> ParseEtcdEndpoints(std::string_view list) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string_view::npos) comma = list.size();
    std::string word(list.substr(pos, comma - pos));
    pos = comma + 1;
    while (!word.empty() && word.front() == ' ') word.erase(word.begin());
    while (!word.empty() && word.back() == ' ') word.pop_back();
    if (word.empty()) continue;
    std::string e = Normalize(word);
    const size_t host = e.find("://") + 3;
    const size_t colon = e.rfind(':');
    if (colon == std::string::npos || colon < host || colon + 1 >= e.size()) {
      return InvalidArgument("etcd endpoint '", word, "' has no port (e.g. 127.0.0.1:2379)");
    }
    for (size_t i = colon + 1; i < e.size(); ++i) {
      if (e[i] < '0' || e[i] > '9') {
        return InvalidArgument("etcd endpoint '", word, "': bad port");
      }
    }
    out.push_back(e);
  }
  if (out.empty()) return InvalidArgument("no etcd endpoint given (e.g. --etcd 127.0.0.1:2379)");
  return out;
}

Result<std::unique_ptr<EtcdClient>> EtcdClient::Create(const EtcdOptions& options) {
  if (options.endpoints.empty()) return InvalidArgument("etcd: no endpoint");
  if (options.connect_timeout_ms == 0 || options.request_timeout_ms == 0) {
    return InvalidArgument("etcd: timeouts must be > 0");
  }
  GlobalInit();
  EtcdOptions o = options;
  for (auto& e : o.endpoints) e = Normalize(e);
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(o)));
}

EtcdClient::EtcdClient(EtcdOptions options) : options_(std::move(options)) {}
EtcdClient::~EtcdClient() = default;

std::string EtcdClient::current_endpoint() const {
  return options_.endpoints[current_.load() % options_.endpoints.size()];
}

Result<std::string> EtcdClient::Call(const std::string& path, const std::string& body) {
  const size_t n = options_.endpoints.size();
  const size_t first = current_.load();
  std::string errors;
  for (size_t a = 0; a < n; ++a) {
    const size_t idx = (first + a) % n;
    const std::string url = options_.endpoints[idx] + path;
    CURL* h = curl_easy_init();
    if (h == nullptr) return Internal("etcd: curl_easy_init failed");
    std::string reply;
    char err[CURL_ERROR_SIZE] = {0};
    curl_slist* headers = SetUpJsonPost(h, url, body, &AppendBody, &reply, err,
                                        options_.connect_timeout_ms);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS,
                     static_cast<long>(options_.connect_timeout_ms + options_.request_timeout_ms));
    const CURLcode rc = curl_easy_perform(h);
    long http = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &http);
    curl_slist_free_all(headers);
    curl_easy_cleanup(h);
    if (rc != CURLE_OK) {
      errors += (errors.empty() ? "" : "; ") + options_.endpoints[idx] + ": " +
                (err[0] ? std::string(err) : std::string(curl_easy_strerror(rc)));
      continue;
    }
    current_.store(idx);
    if (http == 404 && reply.find('{') == std::string::npos) {
      return Unsupported("etcd at ", options_.endpoints[idx], " has no ", path,
                         " (HTTP 404): is it etcd 3.4 or newer?");
    }
    if (http >= 500 && reply.find('{') == std::string::npos) {
      errors += (errors.empty() ? "" : "; ") + options_.endpoints[idx] + ": HTTP " +
                std::to_string(http);
      continue;
    }
    return reply;
  }
  return Unavailable("etcd unreachable (", errors, ")");
}

Status EtcdClient::Put(std::string_view key, std::string_view value, int64_t lease) {
  json req = {{"key", B64Encode(key)}, {"value", B64Encode(value)}};
  if (lease != 0) req["lease"] = std::to_string(lease);
  TESSERA_ASSIGN_OR_RETURN(std::string text, Call("/v3/kv/put", req.dump()));
  TESSERA_ASSIGN_OR_RETURN(json j, ParseJson(text));
  (void)j;
  return Status::Ok();
}

namespace {
Result<RangeResult> ParseRange(const std::string& text) {
  TESSERA_ASSIGN_OR_RETURN(json j, ParseJson(text));
  RangeResult r;
  if (j.contains("header")) r.revision = Int(j["header"], "revision");
  if (j.contains("kvs") && j["kvs"].is_array()) {
    for (const auto& e : j["kvs"]) {
      TESSERA_ASSIGN_OR_RETURN(KeyValue kv, ParseKv(e));
      r.kvs.push_back(std::move(kv));
    }
  }
  return r;
}
}  // namespace

Result<RangeResult> EtcdClient::Get(std::string_view key) {
  json req = {{"key", B64Encode(key)}};
  TESSERA_ASSIGN_OR_RETURN(std::string text, Call("/v3/kv/range", req.dump()));
  return ParseRange(text);
}

Result<RangeResult> EtcdClient::GetPrefix(std::string_view prefix) {
  json req = {{"key", B64Encode(prefix)}, {"range_end", B64Encode(PrefixEnd(prefix))}};
  TESSERA_ASSIGN_OR_RETURN(std::string text, Call("/v3/kv/range", req.dump()));
  return ParseRange(text);
}

Result<int64_t> EtcdClient::Delete(std::string_view key) {
  json req = {{"key", B64Encode(key)}};
  TESSERA_ASSIGN_OR_RETURN(std::string text, Call("/v3/kv/deleterange", req.dump()));
  TESSERA_ASSIGN_OR_RETURN(json j, ParseJson(text));
  return Int(j, "deleted");
}

Result<int64_t> EtcdClient::GrantLease(int64_t ttl_s) {
  if (ttl_s < 1) return InvalidArgument("etcd: lease TTL must be >= 1 s");
  json req = {{"TTL", std::to_string(ttl_s)}};
  TESSERA_ASSIGN_OR_RETURN(std::string text, Call("/v3/lease/grant", req.dump()));
  TESSERA_ASSIGN_OR_RETURN(json j, ParseJson(text));
  const int64_t id = Int(j, "ID");
  if (id == 0) return ProtocolError("etcd: lease grant without an ID: ", text.substr(0, 200));
  return id;
}

Result<int64_t> EtcdClient::KeepAlive(int64_t lease) {
  json req = {{"ID", std::to_string(lease)}};
  TESSERA_ASSIGN_OR_RETURN(std::string text, Call("/v3/lease/keepalive", req.dump()));
  // A stream of one response: {"result": {..., "ID": .., "TTL": ..}}. TTL absent (0): expired.
  const size_t nl = text.find('\n');
  TESSERA_ASSIGN_OR_RETURN(json j, ParseJson(nl == std::string::npos ? text : text.substr(0, nl)));
  const json& r = j.contains("result") ? j["result"] : j;
  const int64_t ttl = Int(r, "TTL");
  if (ttl <= 0) return NotFound("etcd: lease ", lease, " expired");
  return ttl;
}

Status EtcdClient::RevokeLease(int64_t lease) {
  json req = {{"ID", std::to_string(lease)}};
  TESSERA_ASSIGN_OR_RETURN(std::string text, Call("/v3/lease/revoke", req.dump()));
  TESSERA_ASSIGN_OR_RETURN(json j, ParseJson(text));
  (void)j;
  return Status::Ok();
}

// ---- EtcdWatch ----

Result<std::unique_ptr<EtcdWatch>> EtcdWatch::Start(const EtcdOptions& options,
                                                    std::string prefix, Callbacks callbacks,
                                                    uint32_t retry_ms) {
  if (!callbacks.on_snapshot || !callbacks.on_events) {
    return InvalidArgument("etcd watch: on_snapshot and on_events are required");
  }
  TESSERA_ASSIGN_OR_RETURN(auto client, EtcdClient::Create(options));
  std::unique_ptr<EtcdWatch> w(new EtcdWatch());
  w->options_ = client->options();
  w->prefix_ = std::move(prefix);
  w->cb_ = std::move(callbacks);
  w->retry_ms_ = retry_ms == 0 ? 1 : retry_ms;
  w->client_ = std::move(client);
  w->multi_ = curl_multi_init();
  if (w->multi_ == nullptr) return Internal("etcd watch: curl_multi_init failed");
  EtcdWatch* self = w.get();
  w->thread_ = std::thread([self] { self->Run(); });
  return w;
}

EtcdWatch::~EtcdWatch() {
  stop_.store(true);
  if (multi_ != nullptr) curl_multi_wakeup(static_cast<CURLM*>(multi_));
  if (thread_.joinable()) thread_.join();
  if (multi_ != nullptr) curl_multi_cleanup(static_cast<CURLM*>(multi_));
}

void EtcdWatch::Run() {
  uint64_t failures = 0;
  while (!stop_.load()) {
    Status st = Once();
    if (stop_.load()) break;
    ++failures;
    if (cb_.on_error) cb_.on_error(st);
    if ((failures & (failures - 1)) == 0) {  // Logs the 1st, 2nd, 4th, ... failure.
      TLOG(WARNING) << "etcd watch on " << prefix_ << ": " << st << " (retrying every "
                    << retry_ms_ << " ms)";
    }
    // Sleep retry_ms, waking early on stop (curl_multi_poll returns on curl_multi_wakeup).
    int numfds = 0;
    curl_multi_poll(static_cast<CURLM*>(multi_), nullptr, 0, static_cast<int>(retry_ms_),
                    &numfds);
  }
}

namespace {
struct StreamState {
  std::string buf;
  bool created = false;
  Status error;
  std::vector<std::vector<WatchEvent>> batches;  // Parsed, not yet delivered.
  int64_t last_revision = 0;
};

size_t OnStream(char* data, size_t size, size_t n, void* user) {
  auto* s = static_cast<StreamState*>(user);
  s->buf.append(data, size * n);
  size_t nl;
  while ((nl = s->buf.find('\n')) != std::string::npos) {
    std::string line = s->buf.substr(0, nl);
    s->buf.erase(0, nl + 1);
    if (line.empty() || line == "\r") continue;
    auto j = ParseJson(line);
    if (!j.ok()) {
      s->error = j.status();
      return 0;  // Aborts the transfer.
    }
    const json& r = j->contains("result") ? (*j)["result"] : *j;
    if (r.value("canceled", false)) {
      s->error = Unavailable("etcd watch canceled: ", r.value("cancel_reason", std::string()),
                             Int(r, "compact_revision") ? " (revision compacted)" : "");
      return 0;
    }
    if (r.value("created", false)) s->created = true;
    if (r.contains("header")) s->last_revision = Int(r["header"], "revision");
    if (r.contains("events") && r["events"].is_array()) {
      std::vector<WatchEvent> events;
      for (const auto& e : r["events"]) {
        WatchEvent ev;
        ev.type = e.value("type", std::string("PUT")) == "DELETE" ? WatchEvent::Type::kDelete
                                                                  : WatchEvent::Type::kPut;
        if (e.contains("kv")) {
          auto kv = ParseKv(e["kv"]);
          if (!kv.ok()) {
            s->error = kv.status();
            return 0;
          }
          ev.kv = std::move(*kv);
        }
        events.push_back(std::move(ev));
      }
      if (!events.empty()) s->batches.push_back(std::move(events));
    }
  }
  return size * n;
}
}  // namespace

Status EtcdWatch::Once() {
  // 1. List (through the failover client: the endpoint that answered last first).
  auto listed = client_->GetPrefix(prefix_);
  if (!listed.ok()) return listed.status();
  snapshots_.fetch_add(1);
  cb_.on_snapshot(*listed);
  // 2. Watch from the revision after the list, on the endpoint that answered it.
  const std::string url = client_->current_endpoint() + "/v3/watch";
  json req = {{"create_request",
               {{"key", B64Encode(prefix_)},
                {"range_end", B64Encode(PrefixEnd(prefix_))},
                {"start_revision", std::to_string(listed->revision + 1)}}}};
  const std::string body = req.dump();
  CURL* h = curl_easy_init();
  if (h == nullptr) return Internal("etcd watch: curl_easy_init failed");
  StreamState s;
  char err[CURL_ERROR_SIZE] = {0};
  curl_slist* headers =
      SetUpJsonPost(h, url, body, &OnStream, &s, err, options_.connect_timeout_ms);
  // A stream has no overall timeout; a dead peer on another host is found by TCP keepalives.
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 2L);
  curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 1L);
  CURLM* m = static_cast<CURLM*>(multi_);
  curl_multi_add_handle(m, h);
  Status result = Unavailable("etcd watch stream ended");
  while (!stop_.load()) {
    int running = 0;
    CURLMcode mc = curl_multi_perform(m, &running);
    if (mc != CURLM_OK) {
      result = Internal("etcd watch: ", curl_multi_strerror(mc));
      break;
    }
    // Deliver what arrived (outside libcurl's callback, so a slow consumer never holds it).
    for (auto& batch : s.batches) cb_.on_events(batch);
    s.batches.clear();
    if (running == 0) {
      int left = 0;
      CURLMsg* msg = curl_multi_info_read(m, &left);
      CURLcode rc = msg != nullptr ? msg->data.result : CURLE_OK;
      if (!s.error.ok()) {
        result = s.error;
      } else if (rc != CURLE_OK) {
        result = Unavailable("etcd watch at ", client_->current_endpoint(), ": ",
                             err[0] ? std::string(err) : std::string(curl_easy_strerror(rc)));
      } else {
        long http = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &http);
        result = Unavailable("etcd watch at ", client_->current_endpoint(),
                             " closed the stream (HTTP ", http, ")");
      }
      break;
    }
    int numfds = 0;
    curl_multi_poll(m, nullptr, 0, 1000, &numfds);
  }
  curl_multi_remove_handle(m, h);
  curl_slist_free_all(headers);
  curl_easy_cleanup(h);
  if (stop_.load()) return Cancelled("etcd watch stopped");
  return result;
}

}  // namespace tessera::membership
