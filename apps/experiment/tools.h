// Small helpers of the experiment runner: running a tool to completion, reading /proc.
//
// Threads: free functions, callable from any thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tessera::experiment {

struct ToolResult {
  int exit_code = -1;  // 128+N for a signal death.
  std::string output;  // stdout and stderr together.
};
// Runs argv (PATH searched) with a deadline; kills it when the deadline passes (Timeout).
Result<ToolResult> RunTool(const std::vector<std::string>& argv, int timeout_ms);

// CPU time (user + system) of a process in clock ticks, and its resident set in bytes;
// false when it is gone.
bool ProcUsage(pid_t pid, uint64_t* cpu_ticks, uint64_t* rss_bytes);

// The whole file, or "" when it cannot be read.
std::string ReadWholeFile(const std::string& path);
Status WriteWholeFile(const std::string& path, const std::string& text);

// The data directory of the built-in scenarios' workloads (`${data_dir}` in a scenario's
// command): share/tessera beside the executables' directory (build/share/tessera in a build
// tree, PREFIX/share/tessera from PREFIX/libexec/tessera once installed); "" when neither
// holds workloads/.
std::string DataDir(const std::string& bin_dir);

}  // namespace tessera::experiment
