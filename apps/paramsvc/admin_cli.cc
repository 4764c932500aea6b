#include "apps/paramsvc/admin_cli.h"

#include <gflags/gflags.h>

#include "common/units.h"

DEFINE_string(boundary_timeout, "30s",
              "Per move: how long to wait for the job to reach an iteration boundary (every "
              "round closed) before giving up, the job staying where it is; keep it below the "
              "workers' op timeout (60s by default)");
DEFINE_bool(allow_no_checkpoints, false,
            "Move to services without a checkpoint store (--store) even from one with");
DEFINE_string(auth_token_file, "",
              "Admin credential (`tessera token issue --admin`) or the cluster secret; empty: "
              "the development secret");
DEFINE_int32(timeout_ms, 10000, "Bound on connecting to a service and on each status reply");

namespace tessera::paramsvc {

std::vector<std::string> AdminFlagNames() {
  return {"boundary_timeout", "allow_no_checkpoints", "auth_token_file", "timeout_ms"};
}

AdminFlags ReadAdminFlags(const cli::CliSpec& spec) {
  auto ns = ParseDurationNs(FLAGS_boundary_timeout);
  if (!ns.ok() || *ns < 100000000ull || *ns > 600000000000ull) {
    cli::UsageError(spec, "--boundary_timeout must be a duration in 100ms..10m");
  }
  if (FLAGS_timeout_ms < 100 || FLAGS_timeout_ms > 600000) {
    cli::UsageError(spec, "--timeout_ms must be in 100..600000");
  }
  AdminFlags f;
  f.admin = AdminOptions{spec.name, FLAGS_auth_token_file, FLAGS_timeout_ms};
  f.boundary_timeout_ms = static_cast<uint32_t>(*ns / 1000000);
  f.allow_no_checkpoints = FLAGS_allow_no_checkpoints;
  return f;
}

std::vector<std::string> EndpointList(const cli::CliSpec& spec, const std::string& text,
                                      const char* what) {
  std::vector<std::string> eps = SplitList(text);
  for (const auto& e : eps) {
    if (Status s = CheckEndpointText(e, what); !s.ok()) cli::UsageError(spec, s.message());
  }
  return eps;
}

}  // namespace tessera::paramsvc
