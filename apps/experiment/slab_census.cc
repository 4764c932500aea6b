#include "apps/experiment/slab_census.h"

#include <string_view>

#include "common/clock.h"
#include "fabric/control_client.h"

namespace tessera::experiment {
namespace {

// The value of "key VALUE" on its own line of a STATS text.
Result<uint64_t> StatValue(const std::string& text, std::string_view key) {
  const std::string needle = "\n" + std::string(key) + " ";
  size_t at = ("\n" + text).find(needle);
  if (at == std::string::npos) return NotFound("STATS has no ", key);
  at += needle.size() - 1;  // Index in `text` of the value.
  uint64_t v = 0;
  bool any = false;
  for (size_t i = at; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    v = v * 10 + static_cast<uint64_t>(text[i] - '0');
    any = true;
  }
  if (!any) return ProtocolError("STATS ", key, " is not a number");
  return v;
}

}  // namespace

Result<SlabCensus> TakeSlabCensus(client::LocalCluster& cluster, int timeout_ms) {
  SlabCensus c;
  for (size_t i = 0; i < cluster.size(); ++i) {
    if (!cluster.Running(i)) continue;
    fabric::ConnectOptions co;
    co.secret = cluster.secret();
    co.client_id = 0x5ab5;  // A client of its own: it owns no slabs, it only asks.
    co.deadline = Deadline::AfterMs(static_cast<uint64_t>(timeout_ms));
    auto conn = fabric::ControlClient::Connect(cluster.endpoints()[i], co);
    if (!conn.ok()) return conn.status().WithContext("slab census: server " + std::to_string(i));
    auto text = (*conn)->Stats(Deadline::AfterMs(static_cast<uint64_t>(timeout_ms)));
    if (!text.ok()) return text.status().WithContext("slab census: server " + std::to_string(i));
    auto n = StatValue(*text, "slabs_allocated");
    if (!n.ok()) return n.status().WithContext("slab census: server " + std::to_string(i));
    c.allocated += *n;
    auto orphans = StatValue(*text, "orphaned_owners");
    auto reclaimed = StatValue(*text, "orphan_slabs_reclaimed");
    if (orphans.ok()) c.orphaned_owners += *orphans;
    if (reclaimed.ok()) c.orphan_slabs_reclaimed += *reclaimed;
    auto owners = StatValue(*text, "slab_owners");
    if (owners.ok()) {
      c.owners_per_server += (c.owners_per_server.empty() ? "" : " ") + std::to_string(i) + ":" +
                             std::to_string(*owners);
    }
    c.servers++;
    c.per_server +=
        (c.per_server.empty() ? "" : " ") + std::to_string(i) + ":" + std::to_string(*n);
  }
  return c;
}

}  // namespace tessera::experiment
