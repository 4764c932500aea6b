// The built-in scenarios (apps/experiment/scenarios/*.toml), embedded in the binary at build
// time so `tessera experiment run NAME` works from any directory.
//
// Threads: immutable data; any thread.
#pragma once

#include <string>
#include <vector>

namespace tessera::experiment {

struct BuiltinScenario {
  const char* name;  // File name without .toml.
  const char* text;  // The TOML source.
};

const std::vector<BuiltinScenario>& BuiltinScenarios();
// nullptr when there is no built-in of that name.
const BuiltinScenario* FindBuiltin(const std::string& name);

}  // namespace tessera::experiment
