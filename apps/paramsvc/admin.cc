#include "apps/paramsvc/admin.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/clock.h"
#include "fabric/credential.h"
#include "fabric/transport.h"

namespace tessera::paramsvc {
namespace {

using json = nlohmann::json;

std::string Mib(uint64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return b;
}

std::string Describe(const json& j) {
  char ms[64];
  std::snprintf(ms, sizeof(ms), "frozen %.0f ms (%.0f ms to reach an iteration boundary)",
                j.value("frozen_ms", 0.0), j.value("boundary_ms", 0.0));
  std::string s = "moved job '" + j.value("job", std::string()) + "' from " +
                  j.value("from", std::string()) + " to " + j.value("to", std::string()) +
                  " (move " + std::to_string(j.value("move_id", 0ULL)) + "): " +
                  std::to_string(j.value("partitions", 0)) + " partitions, " +
                  Mib(j.value("state_bytes", 0ULL)) + ", versions " +
                  std::to_string(j.value("version_min", 0ULL)) + ".." +
                  std::to_string(j.value("version_max", 0ULL)) + ", " + ms;
  if (!j.value("durable", false)) s += "; the destination does not checkpoint it";
  if (!j.value("acknowledged", true)) {
    s += "; the destination has not acknowledged the commit yet (the source keeps sending it)";
  }
  return s;
}

}  // namespace

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

Result<std::unique_ptr<Client>> ConnectAdmin(const std::string& endpoint, const AdminOptions& o,
                                             int op_timeout_ms) {
  auto ep = fabric::ParseEndpoint(endpoint);
  if (!ep.ok()) return ep.status();
  auto cred = fabric::LoadCredential(o.token_file, o.tool);
  if (!cred.ok()) return cred.status();
  ClientOptions co;
  co.host = ep->host;
  co.port = ep->port;
  co.secret = cred->key;
  co.client_id = cred->client_id;  // 0 (the cluster secret): a random id.
  co.connect_timeout_ms = o.timeout_ms;
  co.op_timeout_ms = op_timeout_ms;
  auto c = Client::Connect(co);
  if (!c.ok()) return c.status().WithContext(endpoint);
  return c;
}

Result<json> ServiceStatus(const std::string& endpoint, const AdminOptions& o) {
  auto c = ConnectAdmin(endpoint, o, o.timeout_ms);
  if (!c.ok()) return c.status();
  auto s = (*c)->StatusJson();
  if (!s.ok()) return s.status().WithContext(endpoint);
  json j = json::parse(*s, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return ProtocolError(endpoint, " sent malformed JSON");
  return j;
}

Result<std::string> LocateJob(const std::vector<std::string>& servers, const std::string& name,
                              const AdminOptions& o) {
  std::vector<std::string> todo = servers;
  std::vector<std::string> seen;
  Status last = NotFound("no service of ", servers.size(), " has job '", name, "'");
  for (size_t i = 0; i < todo.size() && seen.size() < servers.size() + 8; ++i) {
    const std::string& ep = todo[i];
    if (std::find(seen.begin(), seen.end(), ep) != seen.end()) continue;
    seen.push_back(ep);
    auto st = ServiceStatus(ep, o);
    if (!st.ok()) {
      last = st.status();
      continue;
    }
    const json& j = *st;
    for (const auto& job : j.value("jobs", json::array())) {
      if (job.value("name", std::string()) == name && job.value("place", std::string()) != "staged") {
        return ep;
      }
    }
    for (const auto& m : j.value("moved", json::array())) {
      if (m.value("name", std::string()) == name) todo.push_back(m.value("to", std::string()));
    }
  }
  if (last.code() == StatusCode::kNotFound) {
    return NotFound("job '", name, "' is on none of ", seen.size(), " services looked at");
  }
  return NotFound("job '", name, "' not found (", last.ToString(), ")");
}

MoveOutcome RunMove(const std::string& source, const std::string& name, const std::string& to,
                    uint32_t boundary_timeout_ms, bool allow_volatile, const AdminOptions& o) {
  MoveOutcome out;
  auto c = ConnectAdmin(source, o, static_cast<int>(boundary_timeout_ms) + 120000);
  if (!c.ok()) {
    out.message = "cannot reach the source: " + c.status().ToString();
    return out;
  }
  auto r = (*c)->MoveJob(name, to, boundary_timeout_ms, allow_volatile);
  if (r.ok()) {
    out.moved = true;
    out.report = *r;
    const json j = json::parse(*r, nullptr, false);
    out.message = j.is_discarded() ? *r : Describe(j);
    return out;
  }
  if ((*c)->connected()) {  // The source answered: the move aborted, the job stays.
    out.message = "the move aborted; job '" + name + "' stays on " + source + ": " +
                  r.status().ToString();
    return out;
  }
  // The source went away mid-move. Which side of the commit point it reached is in its
  // supervisor's records: ask the restarted source.
  const Deadline d = Deadline::AfterMs(60000);
  Status last = r.status();
  while (!d.Expired()) {
    auto st = ServiceStatus(source, o);
    if (st.ok()) {
      const json& j = *st;
      {
        for (const auto& m : j.value("moved", json::array())) {
          if (m.value("name", std::string()) == name && m.value("to", std::string()) == to) {
            out.moved = true;
            out.message = "the source went down after the move's commit point: job '" + name +
                          "' is on " + to + " (move " + std::to_string(m.value("move_id", 0ULL)) +
                          ")";
            return out;
          }
        }
        for (const auto& job : j.value("jobs", json::array())) {
          if (job.value("name", std::string()) == name) {
            out.message = "the source went down before the move's commit point: job '" + name +
                          "' stays on " + source + " (restored from its checkpoint)";
            return out;
          }
        }
        out.message = "the source went down mid-move and does not have job '" + name +
                      "' any more; look for it with `tessera paramsvc status`";
        return out;
      }
    }
    last = st.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // Retry pacing, not sync.
  }
  out.message = "the source went down mid-move and is still down (" + last.ToString() +
                "): job '" + name + "' is on " + to + " if the source recorded the commit, on " +
                source + " otherwise (`tessera paramsvc status` both once it is back)";
  return out;
}

}  // namespace tessera::paramsvc
