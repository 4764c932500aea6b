// What the operator's commands share (`tessera paramsvc move`, `drain`, `rebalance`): an admin
// connection to a service, finding where a job is now, and running one move with a clear
// outcome even when the source dies in the middle of it (server.h "Moves between servers").
//
// Thread safety: functions of their arguments; one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/paramsvc/client/client.h"
#include "common/status.h"

namespace tessera::paramsvc {

struct AdminOptions {
  std::string tool;        // "tessera paramsvc move", for messages
  std::string token_file;  // --auth_token_file: an admin credential or the cluster secret
  int timeout_ms = 10000;  // Connecting and each status reply
};

// "a,b,c" -> {"a", "b", "c"} (empty items dropped).
std::vector<std::string> SplitList(const std::string& text);

// An admin connection to the service at "HOST:PORT" whose replies may take op_timeout_ms.
Result<std::unique_ptr<Client>> ConnectAdmin(const std::string& endpoint, const AdminOptions& o,
                                             int op_timeout_ms);
// The service's STATUS, parsed (ProtocolError when it is not JSON).
Result<nlohmann::json> ServiceStatus(const std::string& endpoint, const AdminOptions& o);

// The service holding job `name` (not a staged copy): looked for in `servers`, following the
// tombstones of moved jobs (up to 8). NotFound when none has it.
Result<std::string> LocateJob(const std::vector<std::string>& servers, const std::string& name,
                              const AdminOptions& o);

struct MoveOutcome {
  bool moved = false;   // The job is on the destination now
  std::string report;   // The service's JSON report (when it answered)
  std::string message;  // One line for the operator
};
// Asks `source` to move job `name` to `to` and waits for the outcome. When the source's
// connection breaks mid-move (it died), asks it again once it is back (up to 60 s) which side
// of the commit point the move reached.
MoveOutcome RunMove(const std::string& source, const std::string& name, const std::string& to,
                    uint32_t boundary_timeout_ms, bool allow_volatile, const AdminOptions& o);

}  // namespace tessera::paramsvc
