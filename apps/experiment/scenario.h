// Scenario: one failure-injection experiment, parsed from a TOML file (toml++).
//
// A scenario names a cluster (memservers, racks, code, placement), a workload (an unmodified
// program under `tessera run`, the built-in pagestore load generator, the Parameter Service or a
// Kayak KV load), a schedule of faults and the expectations that make its verdict. The file
// format is documented in the README ("tessera experiment") and in ParseScenario() below; every
// key is checked, so an unknown key or a bad value is an InvalidArgument naming the file and
// line.
//
// Variants: `[[variant]]` tables run the same scenario once per variant with a few cluster
// settings changed (delta, placement, layout) and their own `[variant.expect]`; they are how
// a scenario compares delta 0 with delta 1, or CodingSets with random placement.
//
// Quick size: a `[quick]` table overrides duration_s, scales the fault times (time_scale) and
// overrides workload keys (`[quick.workload]`); `tessera experiment run --quick` applies it.
//
// Threads: plain values; parse on any thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace tessera::experiment {

struct ClusterSpec {
  int memservers = 0;  // Required, 1..64.
  int racks = 0;       // 0: no rack labels; else servers i*racks/N... (contiguous blocks).
  std::string layout;  // split | group; "" = split for pagestore, the tool's own otherwise.
  int k = 4;
  int r = 2;
  int delta = 1;
  int l = 2;                             // CodingSets slack (coding group = k+r+l servers).
  std::string placement = "codingsets";  // codingsets | random
  std::string capacity = "256M";         // Per memserver.
  std::string slab_size = "1M";
  int op_timeout_ms = 2000;
  int heartbeat_timeout_ms = 1000;
  int max_inflight_pages = 256;  // Client: pages in flight per I/O thread (pagestore).
  // loopback, or netns: each memserver a host of its own, in a network namespace on a bridge
  // (client/hosts.h); a partition then takes the host's link down.
  std::string hosts = "loopback";
  // static: the store is given the cluster's server list. etcd: the runner starts an etcd of
  // its own, every memserver registers in it under a lease of etcd_ttl_s, and the pagestore's
  // store follows that membership (membership::StoreFollower); the fault target `etcd` needs it.
  std::string membership = "static";
  int etcd_ttl_s = 3;
  // The memservers' --orphan_grace: an owner (client process) with no connection for this long
  // loses its slabs. "0": never (the runner's default: nothing is reclaimed behind a client).
  std::string orphan_grace = "0";
};

// The kinds of workload, parsed once from `kind = "..."`; each kind has its own options below
// and its own implementation under apps/experiment/workloads/.
enum class WorkloadKind { kRun, kSwap, kPagestore, kKv, kParamsvc };
const char* WorkloadKindName(WorkloadKind k);
// InvalidArgument naming the known kinds when `name` is none of them.
Result<WorkloadKind> ParseWorkloadKind(const std::string& name);
// run and swap: an unmodified program, whose output can be compared with a local run's.
inline bool RunsAProgram(WorkloadKind k) { return k == WorkloadKind::kRun || k == WorkloadKind::kSwap; }

// kind = run: an unmodified program under `tessera run` (the userfaultfd pager); kind = swap: the
// same under `tessera run --pager swap` (a private `tessera swap` kernel swap device).
struct ProgramOptions {
  std::vector<std::string> command;  // ${data_dir}: the installed data (share/tessera).
  std::string local_memory = "50%";
};

// kind = pagestore: the in-process load generator on an erasure-coded store.
struct PagestoreOptions {
  uint64_t pages = 0;
  int qd = 16;
  double read_ratio = 0.9;
  uint64_t ops = 0;           // 0: run until duration_s.
  bool verify_at_end = true;  // Read back and check every page when the load ends.
  int verify_passes = 1;      // Extra final passes (bit-flip scrubbing needs > 1).
  // Pages of the client process (`tessera experiment client`) the fault target `client` kills
  // and restarts; 0: no client process.
  uint64_t client_pages = 0;
};

// kind = paramsvc: `workers` training workers push deterministic gradients of one fp32 tensor
// of `elements` values and pull the parameters until the model reaches version `iterations`.
enum class ParamsvcMode { kSync, kAsync };
struct ParamsvcOptions {
  int workers = 2;
  uint64_t iterations = 0;
  uint64_t elements = 65536;
  ParamsvcMode mode = ParamsvcMode::kSync;
};

// kind = kv: a Kayak KV table of `keys` keys with `value_size`-byte values, `replicas`-way
// replicated, loaded before t = 0 (event "loaded"); then `clients` closed-loop threads issue
// GET, PUT (put_ratio) and Invoke (invoke_ratio: a built-in chase of `hops` hops) through one
// kayak::Client whose controller runs in `mode`.
struct KvOptions {
  uint64_t keys = 4096;
  uint64_t value_size = 128;
  int replicas = 1;
  int clients = 4;
  double put_ratio = 0.3;
  double invoke_ratio = 0.2;
  int hops = 4;
  std::string mode = "kayak";  // kayak::ParseMode: kv | rpc | pushback | kayak
  uint64_t ops = 0;            // 0: run until duration_s.
  bool verify_at_end = true;   // Read every key back when the load ends.
};

// The [workload] table: its kind, and the options of that kind (the others keep their
// defaults and are not used).
struct WorkloadSpec {
  WorkloadKind kind = WorkloadKind::kPagestore;
  ProgramOptions run;  // run and swap.
  PagestoreOptions pagestore;
  ParamsvcOptions paramsvc;
  KvOptions kv;
};

enum class FaultAction {
  kKill,
  kStop,
  kResume,
  kDelay,
  kDrop,
  kBitflip,
  kEvict,
  kPartition,
  kHeal,
  kRestart  // SIGKILL, then a fresh memserver on the same port, added to the pagestore's store.
};
const char* FaultActionName(FaultAction a);

// kEtcd: the runner's etcd ([cluster] membership = "etcd"); kClient: the client process of a
// pagestore workload with client_pages.
enum class TargetKind { kServer, kRandom, kRack, kPage, kAggregator, kEtcd, kClient };
struct Target {
  TargetKind kind = TargetKind::kServer;
  uint64_t n = 0;  // server index, random count, rack index, page id.
  std::string text;
};

struct FaultSpec {
  std::optional<double> at_s;
  std::string at_event;  // A substring of a line the workload prints (run), or "loaded".
  FaultAction action = FaultAction::kKill;
  Target target;
  int count = 0;              // page:P: how many of the page's servers (0 = all).
  std::string delay = "1ms";  // delay
  // stop/delay/drop/partition, and kill of etcd (restarted on its data): undone after this
  // long (0 = never).
  double duration_s = 0;
  int bits = 8;               // bitflip
  int slabs = 1;              // evict
  int line = 0;               // Line of the [[fault]] table in the file.
  // Fires no earlier than at_s/at_event and only once the store has recovered from every
  // permanent failure fired before it: each one declared failed and its data regenerated (a
  // rolling restart's "one at a time", measured instead of guessed from the clock).
  bool after_recovery = false;
};

// Every expectation is optional; only those given are judged.
struct ExpectSpec {
  std::optional<int64_t> data_loss;      // Pages that reported DataLoss (run: store count).
  std::optional<int64_t> wrong_bytes;    // pagestore: bytes read back wrong.
  std::optional<bool> identical_output;  // run, swap: stdout equal to a local run's.
  std::optional<double> max_p99_us_during_faults;
  std::optional<double> max_p99_ratio_during_faults;         // p99 during faults / p99 before.
  std::optional<double> min_throughput_ratio_during_faults;  // lowest 100 ms / median before.
  std::optional<double> regenerated_within_s;
  std::optional<double> max_slowdown_vs_healthy;  // completion time / a healthy run's.
  std::optional<bool> corruptions_repaired_all;
  std::optional<bool> data_loss_exactly_affected;      // pagestore: lost pages == predicted set.
  std::optional<double> max_loss_error_vs_prediction;  // |lost fraction - sim's| (pagestore).
  // pagestore: the slabs allocated over the running memservers at the end (regeneration done)
  // equal those right after the pages were written (apps/experiment/slab_census.h).
  std::optional<bool> slabs_back_to_baseline;
  // pagestore: servers the store declared failed although no fault failed them for good.
  std::optional<int64_t> false_failures;
  std::string p99_below_variant;         // read p99 during faults below that variant's.
  std::string throughput_above_variant;  // lowest 300 ms throughput during faults above.
  std::string fewer_lost_than_variant;   // fewer pages lost than that variant.
};

struct VariantSpec {
  std::string name;
  std::optional<int> delta;
  std::optional<std::string> placement;
  std::optional<std::string> layout;
  ExpectSpec expect;
  bool has_expect = false;
};

struct QuickSpec {
  std::optional<double> duration_s;
  double time_scale = 1.0;
  std::map<std::string, int> workload_keys_line;  // which workload keys were overridden
  WorkloadSpec workload;  // The scenario's workload with [quick.workload]'s keys applied.
  ExpectSpec expect;  // [quick.expect]: bounds that replace the scenario's at the quick size.
  bool has_expect = false;
  bool present = false;
};

struct Scenario {
  std::string name;
  std::string description;
  uint64_t seed = 1;
  double duration_s = 0;
  ClusterSpec cluster;
  WorkloadSpec workload;
  std::vector<FaultSpec> faults;
  ExpectSpec expect;
  std::vector<VariantSpec> variants;  // Empty: one run.
  QuickSpec quick;
  std::string source;  // The TOML text it came from.
  std::string origin;  // File name or "builtin:NAME".
};

// Parses and checks a scenario. `origin` names it in errors ("file.toml:12: ...").
Result<Scenario> ParseScenario(const std::string& text, const std::string& origin);

// The scenario with its [quick] settings applied (duration, fault times, workload keys).
Scenario ApplyQuick(const Scenario& s);

// The cluster settings of one variant (the scenario's own when `variant` is null).
ClusterSpec VariantCluster(const Scenario& s, const VariantSpec* variant);

}  // namespace tessera::experiment
