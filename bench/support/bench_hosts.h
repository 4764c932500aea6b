// The --hosts and --pin flags of the benches whose servers can run on hosts of their own
// (`tessera bench kayak`, `bench fabric`, `bench paramsvc`): one parser for the three.
//
// --hosts netns puts every server (memservers, and the peer the bench compares with) in a
// network namespace of its own (client/hosts.h); the bench process itself is the client host,
// in the caller's namespace, reaching them over the bridge. --pin places the bench process on
// the client CPUs and the servers on the server CPUs, in either mode. Every JSON row says which
// set-up was used (HostsFields), after any fallback to loopback.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "client/hosts.h"
#include "common/status.h"

namespace tessera::bench {

struct BenchHosts {
  client::HostsMode mode = client::HostsMode::kLoopback;  // As asked for.
  client::PinPlan pin;
};

// Parses the two flag values; the error names the flag and the problem.
Result<BenchHosts> ParseBenchHosts(const std::string& hosts, const std::string& pin);
// Pins the calling thread (the bench's client, and every thread it starts afterwards) to the
// client CPUs. Call it before starting any thread.
Status PinBenchClient(const BenchHosts& hosts);
// For benches that start their servers themselves: `count` namespace hosts when --hosts netns
// asked for them, else nullptr. When they cannot be made, prints "BENCH: warning: WHY; the
// servers run on loopback" on stderr and returns nullptr (the bench runs on loopback).
std::unique_ptr<client::NetHosts> MakeBenchNetHosts(const BenchHosts& hosts, size_t count,
                                                    const std::string& bench);
// The fields every row carries: {"hosts", "netns"|"loopback"} (what was used) and
// {"pin", FormatPin(pin)}.
std::vector<std::pair<std::string, std::string>> HostsFields(client::HostsMode used,
                                                             const client::PinPlan& pin);

// The flags' help texts, so the three benches describe them alike.
inline constexpr const char* kHostsFlagHelp =
    "Where the servers run: loopback (every process on 127.0.0.1, same namespace) or netns (each "
    "server in a network namespace of its own, 198.18.0.0/15 on a bridge; falls back to "
    "loopback with a warning where namespaces cannot be made)";
inline constexpr const char* kPinFlagHelp =
    "CPUs: none, auto (client on the first CPU, servers on the rest), or e.g. "
    "client:0,servers:1 (the bench process on CPU 0, every server on CPU 1)";

}  // namespace tessera::bench
