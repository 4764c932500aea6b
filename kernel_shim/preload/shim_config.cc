// The shim's configuration from its environment (shim_config.h).
#include "kernel_shim/preload/shim_config.h"

#include <stdlib.h>
#include <unistd.h>

#include "common/units.h"

namespace tessera::kernel_shim::shim {
namespace {
constexpr uint64_t kPageBytes = 4096;  // The region is whole pages.
}  // namespace

bool TakeConfig(Config* c, std::string* error) {
  auto take = [](const char* name, std::string* out) {
    const char* v = getenv(name);
    if (v == nullptr) return false;
    *out = v;
    return true;
  };
  const bool configured = take(kEnvCluster, &c->cluster);
  if (configured) {
    // The variable holds the first program's pid: a shell that execs its last command in
    // place is still the first program.
    const char* root = getenv(kEnvDescendant);
    c->descendant = root != nullptr && strtol(root, nullptr, 10) != getpid();
    if (root == nullptr) setenv(kEnvDescendant, std::to_string(getpid()).c_str(), 1);
  }
  std::string k, r, local, region;
  take(kEnvToken, &c->token);
  take(kEnvStats, &c->stats);
  take(kEnvLive, &c->live);
  take(kEnvLogLevel, &c->log_level);
  const bool has_k = take(kEnvK, &k), has_r = take(kEnvR, &r);
  std::string traps, direct, batch, inactive;
  const bool has_traps = take(kEnvWriteTraps, &traps);
  const bool has_inactive = take(kEnvInactiveList, &inactive);
  const bool has_batch = take(kEnvBatchFaults, &batch);
  const bool has_direct = take(kEnvDirectReads, &direct);
  std::string spin, dspin;
  const bool has_spin = take(kEnvFaultSpin, &spin);
  const bool has_dspin = take(kEnvDirectSpin, &dspin);
  take(kEnvLayout, &c->layout);
  std::string follow;
  if (take(kEnvFollow, &follow)) c->follow = follow == "1";
  const bool has_local = take(kEnvLocal, &local), has_region = take(kEnvRegion, &region);
  std::string tier;
  const bool has_tier = take(kEnvCompressedTier, &tier);
  if (const char* pre = configured ? nullptr : getenv("LD_PRELOAD")) {
    std::string kept, entry;
    std::string all = pre;
    size_t i = 0;
    while (i <= all.size()) {
      size_t j = all.find_first_of(": ", i);
      if (j == std::string::npos) j = all.size();
      entry = all.substr(i, j - i);
      if (!entry.empty() && entry.find(kPreloadName) == std::string::npos) {
        kept += (kept.empty() ? "" : ":") + entry;
      }
      i = j + 1;
    }
    if (kept.empty()) unsetenv("LD_PRELOAD");
    else setenv("LD_PRELOAD", kept.c_str(), 1);
  }
  if (!configured) return false;
  // A switch: "0" or "1".
  auto on_off = [error](const char* name, const std::string& v, bool* out) {
    if (v != "0" && v != "1") {
      *error = "bad " + std::string(name) + " '" + v + "' (0 or 1)";
      return false;
    }
    *out = v == "1";
    return true;
  };
  if (has_traps && traps != "auto") {
    bool on = false;
    if (!on_off(kEnvWriteTraps, traps, &on)) {
      *error = "bad " + std::string(kEnvWriteTraps) + " '" + traps + "' (0, 1 or auto)";
      return true;
    }
    c->write_traps = on ? WriteTraps::kOn : WriteTraps::kOff;
  }
  if (has_inactive && !on_off(kEnvInactiveList, inactive, &c->inactive_list)) return true;
  if (has_batch && !on_off(kEnvBatchFaults, batch, &c->batch_faults)) return true;
  if (has_direct && !on_off(kEnvDirectReads, direct, &c->direct_reads)) return true;
  // A spin time: 0..1000 microseconds, digits only.
  auto micros = [error](const char* name, const std::string& v, int* out) {
    const bool digits = !v.empty() && v.size() <= 4 &&
                        v.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || atoi(v.c_str()) > 1000) {
      *error = "bad " + std::string(name) + " '" + v + "' (0..1000 microseconds)";
      return false;
    }
    *out = atoi(v.c_str());
    return true;
  };
  if (has_spin) {
    int us = 0;
    if (!micros(kEnvFaultSpin, spin, &us)) return true;
    c->fault_spin_us = static_cast<uint32_t>(us);
  }
  if (has_dspin && !micros(kEnvDirectSpin, dspin, &c->direct_spin_us)) return true;
  if (has_k) c->k = atoi(k.c_str());
  if (has_r) c->r = atoi(r.c_str());
  if (has_local) {
    auto lm = ParseLocalMemory(local);
    if (!lm.ok()) {
      *error = lm.status().ToString();
      return true;
    }
    c->local = *lm;
  }
  if (has_tier) {
    auto t = ParseCompressedTier(tier);
    if (!t.ok()) {
      *error = "bad " + std::string(kEnvCompressedTier) + ": " + t.status().message();
      return true;
    }
    c->tier = *t;
  }
  if (has_region) {
    auto b = ParseSize(region);
    if (!b.ok() || *b < (64ull << 20) || *b % kPageBytes != 0) {
      *error = "bad " + std::string(kEnvRegion) + " '" + region + "'";
      return true;
    }
    c->region = *b;
  }
  return true;
}

}  // namespace tessera::kernel_shim::shim
