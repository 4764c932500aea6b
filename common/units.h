// Parsing and printing of human units: THE size and duration grammar of every flag, config
// value and environment setting in Tessera (memserver flags, fault commands, tessera nbd/run,
// the LD_PRELOAD shim, benches).
//
// Sizes: "4096", "64K", "16M", "1G", "2T" (binary multiples, optional trailing "B" or "iB",
// case-insensitive: "16MiB", "1gb"). Durations: "250ns", "200us", "500ms", "1.5s", "2m", "1h"
// (a decimal fraction is allowed if it is a whole number of nanoseconds; a bare number is
// rejected so the unit is never guessed). Overflow and junk are errors with the input
// quoted. Pure functions; callable from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace tessera {

Result<uint64_t> ParseSize(std::string_view text);
Result<uint64_t> ParseDurationNs(std::string_view text);

// "16 MiB", "1.5 GiB", "512 B": for logs, stats and the status table.
std::string FormatSize(uint64_t bytes);
// "200us", "1.5ms", "2s".
std::string FormatDurationNs(uint64_t ns);

}  // namespace tessera
