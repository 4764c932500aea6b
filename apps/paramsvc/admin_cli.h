// The flags `tessera paramsvc move`, `drain` and `rebalance` share (defined once, in
// admin_cli.cc; each tool lists AdminFlagNames() as its CliSpec's shared_flags).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "apps/cli/cli.h"
#include "apps/paramsvc/admin.h"

namespace tessera::paramsvc {

// --boundary_timeout, --allow_no_checkpoints, --auth_token_file, --timeout_ms (a function:
// the CliSpecs that list them are built during static initialisation).
std::vector<std::string> AdminFlagNames();

struct AdminFlags {
  AdminOptions admin;
  uint32_t boundary_timeout_ms = 30000;
  bool allow_no_checkpoints = false;
};
// Reads and checks them (a usage error exits 2).
AdminFlags ReadAdminFlags(const cli::CliSpec& spec);

// HOST:PORT,... split and checked; a bad entry is a usage error naming `what` (exits 2).
std::vector<std::string> EndpointList(const cli::CliSpec& spec, const std::string& text,
                                      const char* what);

}  // namespace tessera::paramsvc
