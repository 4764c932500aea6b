#include "bench/support/bench_hosts.h"

#include <cstdio>

namespace tessera::bench {

Result<BenchHosts> ParseBenchHosts(const std::string& hosts, const std::string& pin) {
  BenchHosts out;
  auto mode = client::ParseHostsMode(hosts);
  if (!mode.ok()) return InvalidArgument("--hosts: ", mode.status().message());
  out.mode = *mode;
  auto plan = client::ParsePin(pin);
  if (!plan.ok()) return plan.status();  // Its message starts with "--pin: ".
  out.pin = *plan;
  return out;
}

Status PinBenchClient(const BenchHosts& hosts) {
  return client::PinCallingThread(hosts.pin.client);
}

std::unique_ptr<client::NetHosts> MakeBenchNetHosts(const BenchHosts& hosts, size_t count,
                                                    const std::string& bench) {
  if (hosts.mode != client::HostsMode::kNetns) return nullptr;
  auto net = client::NetHosts::Create(count);
  if (net.ok()) return std::move(*net);
  std::fprintf(stderr, "%s: warning: %s; the servers run on loopback\n", bench.c_str(),
               net.status().message().c_str());
  return nullptr;
}

std::vector<std::pair<std::string, std::string>> HostsFields(client::HostsMode used,
                                                             const client::PinPlan& pin) {
  return {{"hosts", client::HostsModeName(used)}, {"pin", client::FormatPin(pin)}};
}

}  // namespace tessera::bench
