// `tessera paramsvc rebalance HOST:PORT,HOST:PORT,...`: moves jobs off overloaded Parameter
// Services (or onto a service just added) from their measured load (packing.h PlanJobMoves).
#include <gflags/gflags.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "apps/cli/cli.h"
#include "apps/paramsvc/admin_cli.h"
#include "apps/paramsvc/server/packing.h"

DEFINE_double(above, 0.8,
              "Relieve services whose utilisation (measured load / (cores x target "
              "utilisation)) is above this; 0 spreads the load evenly, e.g. onto a service just "
              "added");
DEFINE_int32(max_moves, 8, "At most this many moves (1..1000)");
DEFINE_bool(dry_run, false, "Print the plan, move nothing");
DEFINE_bool(json, false, "One JSON object per service, then one per planned move");

namespace {
const tessera::cli::CliSpec kSpec = {
    "tessera paramsvc rebalance", "HOST:PORT,HOST:PORT[,...] [--above 0.8] [--dry-run]",
    "Balances training jobs over Parameter Services by their measured load: each service's\n"
    "load is what its partitions' bytes per second cost at its measured CPU per byte (the\n"
    "packer's own figures, as `tessera paramsvc status --json` shows them), its capacity its\n"
    "cores times its target utilisation. While the most utilised service is above --above,\n"
    "the job that best evens it with the least utilised service moves there (as `tessera\n"
    "paramsvc move`). Idle jobs weigh nothing: measure under load. Exit 0 when every planned\n"
    "move was made (or none was needed), 1 otherwise.",
    __FILE__, 1, -1, tessera::paramsvc::AdminFlagNames()};
}  // namespace

int main(int argc, char** argv) {
  using namespace tessera;
  using namespace tessera::paramsvc;
  using json = nlohmann::json;
  cli::InitCli(kSpec, &argc, &argv);
  std::vector<std::string> eps;
  for (int i = 1; i < argc; ++i) {
    for (auto& e : EndpointList(kSpec, argv[i], "service")) eps.push_back(e);
  }
  if (eps.size() < 2) cli::UsageError(kSpec, "give at least two services");
  if (!(FLAGS_above >= 0 && FLAGS_above <= 10)) cli::UsageError(kSpec, "--above must be in 0..10");
  if (FLAGS_max_moves < 1 || FLAGS_max_moves > 1000) cli::UsageError(kSpec, "--max_moves must be in 1..1000");
  const AdminFlags af = ReadAdminFlags(kSpec);
  const AdminOptions& o = af.admin;
  std::vector<ServerLoad> servers;
  for (const auto& e : eps) {
    auto st = ServiceStatus(e, o);
    if (!st.ok()) {
      std::fprintf(stderr, "tessera paramsvc rebalance: %s\n", st.status().ToString().c_str());
      return 1;
    }
    const json& j = *st;
    ServerLoad s;
    s.name = e;
    s.capacity = j.value("max_cores", 1) * j.value("target_utilisation", 0.6);
    const double npb = j.value("ns_per_byte", 0.0);
    for (const auto& job : j.value("jobs", json::array())) {
      if (job.value("place", std::string("active")) != "active") continue;
      double bps = 0;
      for (const auto& p : job.value("partitions", json::array())) bps += p.value("bytes_per_s", 0.0);
      s.jobs.emplace_back(job.value("name", std::string()), bps * npb / 1e9);
    }
    servers.push_back(std::move(s));
  }
  auto util = [](const ServerLoad& s) {
    double l = 0;
    for (const auto& [_, x] : s.jobs) l += x;
    return l / s.capacity;
  };
  for (const auto& s : servers) {
    if (FLAGS_json) {
      json jobs = json::object();
      for (const auto& [n, l] : s.jobs) jobs[n] = l;
      std::printf("%s\n", json{{"service", s.name}, {"capacity_cores", s.capacity},
                               {"utilisation", util(s)}, {"job_loads", jobs}}
                              .dump()
                              .c_str());
    } else {
      std::printf("%-24s %zu jobs, utilisation %.2f of %.2f cores\n", s.name.c_str(), s.jobs.size(),
                  util(s), s.capacity);
    }
  }
  const auto plan = PlanJobMoves(servers, FLAGS_above, FLAGS_max_moves);
  if (plan.empty() && !FLAGS_json) std::printf("nothing to move (above %.2f)\n", FLAGS_above);
  int done = 0;
  for (const auto& m : plan) {
    const std::string& from = servers[m.from].name;
    const std::string& to = servers[m.to].name;
    MoveOutcome r;
    if (FLAGS_dry_run) {
      r.message = "would move job '" + m.job + "' from " + from + " to " + to;
    } else {
      r = RunMove(from, m.job, to, af.boundary_timeout_ms, af.allow_no_checkpoints, o);
      if (r.moved) ++done;
    }
    if (FLAGS_json) {
      std::printf("%s\n", json{{"job", m.job}, {"from", from}, {"to", to}, {"load_cores", m.load},
                               {"dry_run", FLAGS_dry_run}, {"moved", r.moved}, {"message", r.message}}
                              .dump()
                              .c_str());
    } else {
      std::printf("%s%s (load %.3f cores)\n", r.moved || FLAGS_dry_run ? "" : "not moved: ",
                  r.message.c_str(), m.load);
    }
    std::fflush(stdout);
  }
  return FLAGS_dry_run || done == static_cast<int>(plan.size()) ? 0 : 1;
}
