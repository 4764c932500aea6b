// The cluster file: the list of memory servers a tool talks to.
//
//   # comment
//   10.0.0.1:7700 rack=r1
//   10.0.0.2:7700            # rack is optional
//   [fe80::1]:7700 rack=r2
//
// One server per line, `HOST:PORT [rack=NAME]`; `#` starts a comment; blank lines are allowed.
// Every line is validated; errors name the file and line number. Duplicate endpoints are errors.
//
// Thread safety: pure functions; any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "fabric/transport.h"

namespace tessera::fabric {

struct ClusterMember {
  Endpoint endpoint;
  std::string rack;  // Empty when not given. [A-Za-z0-9._-]{1,64}.
  int line = 0;      // 1-based line in the file.
};

// Parses file contents; `source` names the file in error messages.
Result<std::vector<ClusterMember>> ParseClusterFile(std::string_view text,
                                                    std::string_view source = "cluster file");
// Reads and parses `path` (NotFound / IoError when unreadable; InvalidArgument when empty of
// servers).
Result<std::vector<ClusterMember>> LoadClusterFile(const std::string& path);

}  // namespace tessera::fabric
