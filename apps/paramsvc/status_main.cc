// `tessera paramsvc status HOST:PORT`: jobs, cores, versions and counters of a Parameter
// Service (its STATUS reply), as a table or as the raw JSON.
#include <gflags/gflags.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "apps/cli/cli.h"
#include "apps/paramsvc/client/client.h"
#include "fabric/auth.h"
#include "fabric/credential.h"
#include "fabric/transport.h"

DEFINE_string(auth_token_file, "", "Credential file (`tessera token issue`) or the cluster secret; empty: the development secret");
DEFINE_bool(json, false, "Print the service's STATUS JSON");
DEFINE_int32(timeout_ms, 5000, "Bound on connecting and on the reply");

namespace {
const tessera::cli::CliSpec kSpec = {
    "tessera paramsvc status", "HOST:PORT [--json] [--auth_token_file F]",
    "Shows a Parameter Service's jobs (mode, versions, pushes, drops, staleness, where each\n"
    "is in a move between services), its cores (active, busy time), whether it checkpoints\n"
    "or drains, and the jobs that moved away from it (to where).",
    __FILE__, 1, 1};
}

int main(int argc, char** argv) {
  using namespace tessera;
  cli::InitCli(kSpec, &argc, &argv);
  auto ep = fabric::ParseEndpoint(argv[1]);
  if (!ep.ok()) cli::UsageError(kSpec, ep.status().message());
  auto cred = fabric::LoadCredential(FLAGS_auth_token_file, "tessera paramsvc status");
  if (!cred.ok()) {
    std::fprintf(stderr, "tessera paramsvc status: %s\n", cred.status().ToString().c_str());
    return 1;
  }
  paramsvc::ClientOptions o;
  o.host = ep->host;
  o.port = ep->port;
  o.secret = cred->key;
  o.client_id = cred->client_id;  // 0 (the cluster secret): a random id.
  o.connect_timeout_ms = FLAGS_timeout_ms;
  o.op_timeout_ms = FLAGS_timeout_ms;
  auto c = paramsvc::Client::Connect(o);
  if (!c.ok()) {
    std::fprintf(stderr, "tessera paramsvc status: %s: %s\n", argv[1], c.status().ToString().c_str());
    return 1;
  }
  auto text = (*c)->StatusJson();
  if (!text.ok()) {
    std::fprintf(stderr, "tessera paramsvc status: %s\n", text.status().ToString().c_str());
    return 1;
  }
  if (FLAGS_json) {
    std::printf("%s\n", text->c_str());
    return 0;
  }
  auto j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded()) {
    std::fprintf(stderr, "tessera paramsvc status: the service sent malformed JSON\n");
    return 1;
  }
  std::printf("paramsvc %s (pid %lld): %d of %d cores active (%s, target %.2f), kernels %s, "
              "checkpoints %s, %.1f core-seconds held\n",
              argv[1], j.value("pid", 0LL), j.value("active_cores", 0), j.value("max_cores", 0),
              j.value("elastic", false) ? "elastic" : "static", j.value("target_utilisation", 0.0),
              j.value("kernel_target", std::string("?")).c_str(),
              j.value("checkpoints", false) ? "on" : "off", j.value("core_seconds", 0.0));
  if (j.value("draining", false)) {
    const std::string to = j.value("drain_to", std::string());
    std::printf("draining: takes no new job%s%s\n", to.empty() ? "" : "; new jobs go to ",
                to.c_str());
  }
  std::printf("%-5s %-20s %-8s %-8s %-10s %-10s %-8s %-8s %-9s %-10s %-9s %-5s\n", "job", "name",
              "workers", "mode", "versions", "pushes", "dropped", "late", "stale_max",
              "migrations", "place", "moves");
  for (const auto& job : j["jobs"]) {
    std::string mode = job.value("mode", std::string("?"));
    if (mode == "bounded") mode += "(" + std::to_string(job.value("staleness_bound", 0)) + ")";
    const std::string versions = std::to_string(job.value("version_min", 0ULL)) + ".." +
                                 std::to_string(job.value("version_max", 0ULL));
    std::printf("%-5d %-20s %-8d %-8s %-10s %-10llu %-8llu %-8llu %-9llu %-10llu %-9s %-5llu\n",
                job.value("job", 0), job.value("name", std::string()).c_str(),
                job.value("workers", 0), mode.c_str(), versions.c_str(),
                job.value("pushes", 0ULL), job.value("dropped", 0ULL),
                job.value("late_aggregated", 0ULL), job.value("staleness_max", 0ULL),
                job.value("migrations", 0ULL), job.value("place", std::string("active")).c_str(),
                job.value("moves", 0ULL));
  }
  for (const auto& m : j.value("moved", nlohmann::json::array())) {
    if (m.value("to", std::string()) == j.value("advertise", std::string("?"))) {
      std::printf("old id: job %d '%s' came back and is here under another id\n",
                  m.value("job", 0), m.value("name", std::string()).c_str());
      continue;
    }
    std::printf("moved away: job %d '%s' -> %s (move %llu%s)\n", m.value("job", 0),
                m.value("name", std::string()).c_str(), m.value("to", std::string()).c_str(),
                m.value("move_id", 0ULL),
                m.value("acknowledged", true) ? "" : ", not acknowledged yet");
  }
  return 0;
}
