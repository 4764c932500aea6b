// `tessera paramsvc drain SERVICE --to HOST:PORT[,...]`: empties a Parameter Service before
// maintenance: new jobs are sent to the first destination, and every job moves to the
// destination with the least model state assigned so far (largest job first).
// `--undo` lets it take new jobs again.
#include <gflags/gflags.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "apps/cli/cli.h"
#include "apps/paramsvc/admin_cli.h"

DEFINE_string(to, "", "Services to move the jobs to (HOST:PORT,...); new jobs go to the first");
DEFINE_bool(undo, false, "Stop draining: the service takes new jobs again (moves nothing back)");
DEFINE_bool(json, false, "One JSON object per job moved (or not), then a summary object");

namespace {
const tessera::cli::CliSpec kSpec = {
    "tessera paramsvc drain", "SERVICE --to HOST:PORT[,HOST:PORT...] | SERVICE --undo",
    "Drains a Parameter Service (HOST:PORT): from now on it takes no new job (clients that\n"
    "register one are sent to the first --to service), and every job it holds moves to one\n"
    "of the --to services while its workers train (as `tessera paramsvc move`), the largest\n"
    "first, each to the service with the least model state given so far. With a checkpoint\n"
    "store the draining survives a restart of its aggregation server. Exit 0 when the service\n"
    "holds no job any more, 1 otherwise (run it again to retry the rest).",
    __FILE__, 1, 1, tessera::paramsvc::AdminFlagNames()};
}  // namespace

int main(int argc, char** argv) {
  using namespace tessera;
  using namespace tessera::paramsvc;
  using json = nlohmann::json;
  cli::InitCli(kSpec, &argc, &argv);
  const std::string source = argv[1];
  if (Status e = CheckEndpointText(source, "SERVICE"); !e.ok()) cli::UsageError(kSpec, e.message());
  const auto dests = EndpointList(kSpec, FLAGS_to, "--to");
  if (FLAGS_undo && !dests.empty()) cli::UsageError(kSpec, "--undo takes no --to");
  if (!FLAGS_undo && dests.empty()) cli::UsageError(kSpec, "give --to HOST:PORT[,...] (or --undo)");
  for (const auto& d : dests) {
    if (d == source) cli::UsageError(kSpec, "--to lists the service being drained");
  }
  const AdminFlags af = ReadAdminFlags(kSpec);
  const AdminOptions& o = af.admin;
  auto admin = ConnectAdmin(source, o, o.timeout_ms);
  if (!admin.ok()) {
    std::fprintf(stderr, "tessera paramsvc drain: %s\n", admin.status().ToString().c_str());
    return 1;
  }
  if (Status s = (*admin)->Drain(!FLAGS_undo, FLAGS_undo ? "" : dests[0]); !s.ok()) {
    std::fprintf(stderr, "tessera paramsvc drain: %s: %s\n", source.c_str(), s.ToString().c_str());
    return 1;
  }
  if (FLAGS_undo) {
    std::printf("%s takes new jobs again\n", source.c_str());
    return 0;
  }
  // What each destination holds already, in model bytes; then the source's jobs, largest first.
  std::map<std::string, uint64_t> held;
  std::map<std::string, json> status;
  for (const auto& e : dests) {
    auto st = ServiceStatus(e, o);
    if (!st.ok()) {
      std::fprintf(stderr, "tessera paramsvc drain: %s\n", st.status().ToString().c_str());
      return 1;
    }
    status[e] = std::move(*st);
  }
  for (const auto& d : dests) {
    uint64_t bytes = 0;
    for (const auto& job : status[d].value("jobs", json::array())) bytes += job.value("model_bytes", 0ULL);
    held[d] = bytes;
  }
  auto sj = ServiceStatus(source, o);
  if (!sj.ok()) {
    std::fprintf(stderr, "tessera paramsvc drain: %s\n", sj.status().ToString().c_str());
    return 1;
  }
  std::vector<std::pair<uint64_t, std::string>> jobs;
  for (const auto& job : sj->value("jobs", json::array())) {
    jobs.emplace_back(job.value("model_bytes", 0ULL), job.value("name", std::string()));
  }
  std::sort(jobs.begin(), jobs.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  int moved = 0;
  for (const auto& [bytes, name] : jobs) {
    std::string to = dests[0];
    for (const auto& d : dests) {
      if (held[d] < held[to]) to = d;
    }
    const MoveOutcome r = RunMove(source, name, to, af.boundary_timeout_ms,
                                  af.allow_no_checkpoints, o);
    if (r.moved) {
      held[to] += bytes;
      ++moved;
    }
    if (FLAGS_json) {
      json j = r.report.empty() ? json::object() : json::parse(r.report, nullptr, false);
      if (j.is_discarded()) j = json::object();
      j["job"] = name;
      j["to"] = to;
      j["moved"] = r.moved;
      j["message"] = r.message;
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%s%s\n", r.moved ? "" : "not moved: ", r.message.c_str());
    }
    std::fflush(stdout);
  }
  const bool done = moved == static_cast<int>(jobs.size());
  if (FLAGS_json) {
    std::printf("%s\n", json{{"service", source}, {"jobs", jobs.size()}, {"moved", moved},
                             {"draining", true}, {"new_jobs_to", dests[0]}}
                            .dump()
                            .c_str());
  } else {
    std::printf("%s: %d of %zu jobs moved; it takes no new job (they go to %s; "
                "`tessera paramsvc drain --undo %s` to take them again)\n",
                source.c_str(), moved, jobs.size(), dests[0].c_str(), source.c_str());
  }
  return done ? 0 : 1;
}
