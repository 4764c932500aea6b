// `tessera paramsvc move --job NAME --to HOST:PORT [--from HOST:PORT[,...]]`: moves a training
// job from the Parameter Service holding it to another one, at an iteration boundary, while
// its workers keep training (server.h "Moves between servers").
#include <gflags/gflags.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "apps/cli/cli.h"
#include "apps/paramsvc/admin_cli.h"

DEFINE_string(job, "", "Name of the job to move");
DEFINE_string(to, "", "The service to move it to (HOST:PORT)");
DEFINE_string(from, "",
              "The service holding the job, or services to look for it in (HOST:PORT,...; "
              "a service the job moved away from leads to where it went); also the positional "
              "argument");
DEFINE_bool(json, false, "Print the move's report as one JSON object");

namespace {
const tessera::cli::CliSpec kSpec = {
    "tessera paramsvc move", "[SOURCE] --job NAME --to HOST:PORT [--from HOST:PORT,...]",
    "Moves a training job to another Parameter Service while its workers train: the source\n"
    "freezes the job at an iteration boundary, hands its state (parameters, optimizer state,\n"
    "versions, counters) to the destination, which persists it, then commits; the workers\n"
    "follow the job to the destination on their own. Nothing is applied twice or lost; if\n"
    "anything fails before the commit point the job stays where it was. Exit 0 when the job\n"
    "is on the destination, 1 when it is not.",
    __FILE__, 0, 1, tessera::paramsvc::AdminFlagNames()};
}  // namespace

int main(int argc, char** argv) {
  using namespace tessera;
  using namespace tessera::paramsvc;
  cli::InitCli(kSpec, &argc, &argv);
  if (FLAGS_job.empty()) cli::UsageError(kSpec, "give --job NAME");
  if (FLAGS_to.empty()) cli::UsageError(kSpec, "give --to HOST:PORT");
  if (Status e = CheckEndpointText(FLAGS_to, "--to"); !e.ok()) cli::UsageError(kSpec, e.message());
  std::string from = FLAGS_from;
  if (argc == 2) from = from.empty() ? argv[1] : from + "," + argv[1];
  if (from.empty()) cli::UsageError(kSpec, "give the service holding the job (SOURCE or --from)");
  const auto sources = EndpointList(kSpec, from, "--from");
  const AdminFlags af = ReadAdminFlags(kSpec);
  const AdminOptions& o = af.admin;
  // The service holding it (a service it left leads to where it went).
  auto source = LocateJob(sources, FLAGS_job, o);
  if (!source.ok()) {
    std::fprintf(stderr, "tessera paramsvc move: %s\n", source.status().ToString().c_str());
    return 1;
  }
  if (*source == FLAGS_to) {
    std::printf("job '%s' is on %s already\n", FLAGS_job.c_str(), FLAGS_to.c_str());
    return 0;
  }
  const MoveOutcome r = RunMove(*source, FLAGS_job, FLAGS_to, af.boundary_timeout_ms,
                                af.allow_no_checkpoints, o);
  if (FLAGS_json) {
    nlohmann::json j = r.report.empty() ? nlohmann::json::object()
                                        : nlohmann::json::parse(r.report, nullptr, false);
    if (j.is_discarded()) j = nlohmann::json::object();
    j["moved"] = r.moved;
    j["message"] = r.message;
    if (!j.contains("job")) j["job"] = FLAGS_job;
    if (!j.contains("from")) j["from"] = *source;
    if (!j.contains("to")) j["to"] = FLAGS_to;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::fprintf(r.moved ? stdout : stderr, "%s%s\n", r.moved ? "" : "tessera paramsvc move: ",
                 r.message.c_str());
  }
  return r.moved ? 0 : 1;
}
