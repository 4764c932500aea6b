#include "apps/experiment/scenario.h"

#include <algorithm>
#include <set>

#include "apps/experiment/scenario_reader.h"
#include "apps/experiment/scenario_workload.h"

namespace tessera::experiment {
namespace {

Status ParseCluster(const Reader& rd, const toml::table& t, ClusterSpec* c) {
  TESSERA_RETURN_IF_ERROR(
      rd.Keys(t, "[cluster]",
              {"memservers", "racks", "layout", "k", "r", "delta", "l", "placement", "capacity",
               "slab_size", "op_timeout_ms", "heartbeat_timeout_ms", "max_inflight_pages",
               "hosts", "membership", "etcd_ttl_s", "orphan_grace"}));
  if (!t.contains("memservers")) return rd.Error(t.source(), "[cluster] needs memservers");
  TRY_ASSIGN(c->memservers, rd.Int(t, "memservers", 1, 64));
  TRY_ASSIGN(c->racks, rd.Int(t, "racks", 0, 64));
  TRY_ASSIGN(c->layout, rd.Str(t, "layout", {"split", "group"}));
  TRY_ASSIGN(c->k, rd.Int(t, "k", 1, 16));
  TRY_ASSIGN(c->r, rd.Int(t, "r", 1, 4));
  TRY_ASSIGN(c->delta, rd.Int(t, "delta", 0, 4));
  TRY_ASSIGN(c->l, rd.Int(t, "l", 0, 8));
  TRY_ASSIGN(c->placement, rd.Str(t, "placement", {"codingsets", "random"}));
  TRY_ASSIGN(c->capacity, rd.Str(t, "capacity"));
  TRY_ASSIGN(c->slab_size, rd.Str(t, "slab_size"));
  TRY_ASSIGN(c->op_timeout_ms, rd.Int(t, "op_timeout_ms", 100, 60000));
  TRY_ASSIGN(c->heartbeat_timeout_ms, rd.Int(t, "heartbeat_timeout_ms", 100, 60000));
  TRY_ASSIGN(c->max_inflight_pages, rd.Int(t, "max_inflight_pages", 8, 16384));
  std::string hosts;
  TRY_ASSIGN(hosts, rd.Str(t, "hosts", {"loopback", "netns"}));
  if (!hosts.empty()) c->hosts = hosts;
  TRY_ASSIGN(c->membership, rd.Str(t, "membership", {"static", "etcd"}));
  TRY_ASSIGN(c->etcd_ttl_s, rd.Int(t, "etcd_ttl_s", 2, 60));
  if (t.contains("etcd_ttl_s") && c->membership != "etcd") {
    return rd.Error(rd.Line(t, "etcd_ttl_s"), "etcd_ttl_s applies to membership = \"etcd\" only");
  }
  if (c->membership == "etcd" && c->racks > 0) {
    return rd.Error(rd.Line(t, "racks"),
                    "racks with membership = \"etcd\": the runner's memservers register without "
                    "rack labels");
  }
  TRY_ASSIGN(c->orphan_grace, rd.Str(t, "orphan_grace"));
  if (c->orphan_grace != "0" && !IsDuration(c->orphan_grace)) {
    return rd.Error(rd.Line(t, "orphan_grace"),
                    "orphan_grace must be \"0\" or a duration like 2s, got '" + c->orphan_grace +
                        "'");
  }
  if (4096 % c->k != 0) return rd.Error(rd.Line(t, "k"), "k must divide 4096 (1, 2, 4, 8, 16)");
  if (c->k + c->r > 20) return rd.Error(rd.Line(t, "r"), "k + r must be at most 20");
  if (c->k + c->r > c->memservers) {
    return rd.Error(rd.Line(t, "memservers"),
                    "memservers must be at least k + r = " + std::to_string(c->k + c->r));
  }
  if (c->racks > c->memservers) {
    return rd.Error(rd.Line(t, "racks"), "racks must not exceed memservers");
  }
  if (!IsSize(c->capacity)) {
    return rd.Error(rd.Line(t, "capacity"),
                    "capacity must be a size like 256M, got '" + c->capacity + "'");
  }
  if (!IsSize(c->slab_size)) {
    return rd.Error(rd.Line(t, "slab_size"),
                    "slab_size must be a size like 1M, got '" + c->slab_size + "'");
  }
  return Status::Ok();
}

Result<Target> ParseTarget(const Reader& rd, const toml::node& n) {
  auto s = n.value_exact<std::string>();
  if (!s) return rd.Error(n.source(), "target must be a string like \"server:2\"");
  Target t;
  t.text = *s;
  if (*s == "aggregator" || *s == "etcd" || *s == "client") {
    t.kind = *s == "aggregator" ? TargetKind::kAggregator
             : *s == "etcd"     ? TargetKind::kEtcd
                                : TargetKind::kClient;
    return t;
  }
  size_t colon = s->find(':');
  std::string kind = colon == std::string::npos ? *s : s->substr(0, colon);
  std::string num = colon == std::string::npos ? "" : s->substr(colon + 1);
  if (kind == "server")
    t.kind = TargetKind::kServer;
  else if (kind == "random")
    t.kind = TargetKind::kRandom;
  else if (kind == "rack")
    t.kind = TargetKind::kRack;
  else if (kind == "page")
    t.kind = TargetKind::kPage;
  else {
    return rd.Error(n.source(),
                    "bad target '" + *s +
                        "' (server:N, random:N, rack:N, page:P, N 0-based; aggregator, etcd, "
                        "client)");
  }
  if (num.empty() || num.size() > 12 ||
      !std::all_of(num.begin(), num.end(), [](char c) { return std::isdigit(c); })) {
    return rd.Error(n.source(), "bad target '" + *s + "': '" + kind + ":' needs a number");
  }
  t.n = std::stoull(num);
  return t;
}

Status ParseExpect(const Reader& rd, const toml::table& t, const std::string& where,
                   ExpectSpec* e) {
  TESSERA_RETURN_IF_ERROR(
      rd.Keys(t, where,
              {"data_loss", "wrong_bytes", "identical_output", "max_p99_us_during_faults",
               "max_p99_ratio_during_faults", "min_throughput_ratio_during_faults",
               "regenerated_within_s", "max_slowdown_vs_healthy", "corruptions_repaired_all",
               "data_loss_exactly_affected", "max_loss_error_vs_prediction", "p99_below_variant",
               "throughput_above_variant", "fewer_lost_than_variant", "slabs_back_to_baseline",
               "false_failures"}));
  auto set_int = [&](const char* k, std::optional<int64_t>* out) -> Status {
    auto r = rd.Int(t, k, 0, int64_t{1} << 40);
    if (!r.ok()) return r.status();
    if (r->has_value()) *out = **r;
    return Status::Ok();
  };
  auto set_num = [&](const char* k, double lo, double hi, std::optional<double>* out) -> Status {
    auto r = rd.Num(t, k, lo, hi);
    if (!r.ok()) return r.status();
    if (r->has_value()) *out = **r;
    return Status::Ok();
  };
  auto set_bool = [&](const char* k, std::optional<bool>* out) -> Status {
    auto r = rd.Bool(t, k);
    if (!r.ok()) return r.status();
    if (r->has_value()) *out = **r;
    return Status::Ok();
  };
  TESSERA_RETURN_IF_ERROR(set_int("data_loss", &e->data_loss));
  TESSERA_RETURN_IF_ERROR(set_int("wrong_bytes", &e->wrong_bytes));
  TESSERA_RETURN_IF_ERROR(set_int("false_failures", &e->false_failures));
  TESSERA_RETURN_IF_ERROR(set_bool("identical_output", &e->identical_output));
  TESSERA_RETURN_IF_ERROR(
      set_num("max_p99_us_during_faults", 1, 1e9, &e->max_p99_us_during_faults));
  TESSERA_RETURN_IF_ERROR(
      set_num("max_p99_ratio_during_faults", 0.01, 1e6, &e->max_p99_ratio_during_faults));
  TESSERA_RETURN_IF_ERROR(
      set_num("min_throughput_ratio_during_faults", 0, 10, &e->min_throughput_ratio_during_faults));
  TESSERA_RETURN_IF_ERROR(set_num("regenerated_within_s", 0.1, 3600, &e->regenerated_within_s));
  TESSERA_RETURN_IF_ERROR(
      set_num("max_slowdown_vs_healthy", 0.1, 1000, &e->max_slowdown_vs_healthy));
  TESSERA_RETURN_IF_ERROR(set_bool("corruptions_repaired_all", &e->corruptions_repaired_all));
  TESSERA_RETURN_IF_ERROR(set_bool("data_loss_exactly_affected", &e->data_loss_exactly_affected));
  TESSERA_RETURN_IF_ERROR(set_bool("slabs_back_to_baseline", &e->slabs_back_to_baseline));
  TESSERA_RETURN_IF_ERROR(
      set_num("max_loss_error_vs_prediction", 0, 1, &e->max_loss_error_vs_prediction));
  TRY_ASSIGN(e->p99_below_variant, rd.Str(t, "p99_below_variant"));
  TRY_ASSIGN(e->fewer_lost_than_variant, rd.Str(t, "fewer_lost_than_variant"));
  TRY_ASSIGN(e->throughput_above_variant, rd.Str(t, "throughput_above_variant"));
  return Status::Ok();
}

// Expectations that need a given workload kind.
Status CheckExpect(const Reader& rd, const toml::table& t, const ExpectSpec& e, WorkloadKind kind) {
  auto need = [&](bool has, const char* key, WorkloadKind k) -> Status {
    if (has && kind != k) {
      return rd.Error(rd.Line(t, key), std::string(key) + " applies to kind = \"" +
                                           WorkloadKindName(k) + "\" workloads only");
    }
    return Status::Ok();
  };
  if (e.identical_output.has_value() && !RunsAProgram(kind)) {
    return rd.Error(rd.Line(t, "identical_output"),
                    "identical_output applies to kind = \"run\" and \"swap\" workloads only");
  }
  if (e.wrong_bytes && RunsAProgram(kind)) {
    return rd.Error(rd.Line(t, "wrong_bytes"),
                    "wrong_bytes applies to kind = \"pagestore\", \"paramsvc\" and \"kv\" "
                    "workloads only");
  }
  TESSERA_RETURN_IF_ERROR(
      need(e.regenerated_within_s.has_value(), "regenerated_within_s", WorkloadKind::kPagestore));
  TESSERA_RETURN_IF_ERROR(need(e.corruptions_repaired_all.has_value(), "corruptions_repaired_all",
                               WorkloadKind::kPagestore));
  TESSERA_RETURN_IF_ERROR(need(e.data_loss_exactly_affected.has_value(),
                               "data_loss_exactly_affected", WorkloadKind::kPagestore));
  TESSERA_RETURN_IF_ERROR(need(e.max_loss_error_vs_prediction.has_value(),
                               "max_loss_error_vs_prediction", WorkloadKind::kPagestore));
  TESSERA_RETURN_IF_ERROR(need(e.slabs_back_to_baseline.has_value(), "slabs_back_to_baseline",
                               WorkloadKind::kPagestore));
  TESSERA_RETURN_IF_ERROR(
      need(e.false_failures.has_value(), "false_failures", WorkloadKind::kPagestore));
  return Status::Ok();
}

Status ParseFault(const Reader& rd, const toml::table& t, const Scenario& s, FaultSpec* f) {
  TESSERA_RETURN_IF_ERROR(rd.Keys(
      t, "[[fault]]",
      {"at_s", "at_event", "action", "target", "count", "delay", "duration_s", "bits", "slabs",
       "after_recovery"}));
  f->line = static_cast<int>(t.source().begin.line);
  std::optional<double> at;
  TRY_ASSIGN(at, rd.Num(t, "at_s", 0, 1e6));
  if (at) f->at_s = at;
  TRY_ASSIGN(f->at_event, rd.Str(t, "at_event"));
  std::optional<bool> after_recovery;
  TRY_ASSIGN(after_recovery, rd.Bool(t, "after_recovery"));
  f->after_recovery = after_recovery.value_or(false);
  if (f->after_recovery && s.workload.kind != WorkloadKind::kPagestore) {
    return rd.Error(rd.Line(t, "after_recovery"),
                    "after_recovery needs a pagestore workload (the store whose recovery it waits for)");
  }
  if (f->at_s.has_value() == !f->at_event.empty()) {
    return rd.Error(t.source(), "[[fault]] needs exactly one of at_s or at_event");
  }
  if (f->at_s && *f->at_s >= s.duration_s) {
    return rd.Error(rd.Line(t, "at_s"), "at_s must be before duration_s");
  }
  if (!f->at_event.empty() && s.workload.kind == WorkloadKind::kParamsvc &&
      f->at_event != "quarter-way" && f->at_event != "half-way") {
    return rd.Error(rd.Line(t, "at_event"),
                    "a paramsvc workload has the events \"quarter-way\" and \"half-way\" (of "
                    "the model versions)");
  }
  if (!f->at_event.empty() && s.workload.kind == WorkloadKind::kPagestore &&
      f->at_event != "loaded") {
    return rd.Error(rd.Line(t, "at_event"),
                    "a pagestore workload has one event, \"loaded\" (its pages are written)");
  }
  if (!f->at_event.empty() && s.workload.kind == WorkloadKind::kKv && f->at_event != "loaded") {
    return rd.Error(rd.Line(t, "at_event"),
                    "a kv workload has one event, \"loaded\" (its table is written)");
  }
  std::string action;
  TRY_ASSIGN(action, rd.Str(t, "action",
                            {"kill", "stop", "resume", "delay", "drop", "bitflip", "evict",
                             "partition", "heal", "restart"}));
  if (action.empty()) return rd.Error(t.source(), "[[fault]] needs action");
  static const std::map<std::string, FaultAction> kActions = {
      {"kill", FaultAction::kKill},     {"stop", FaultAction::kStop},
      {"resume", FaultAction::kResume}, {"delay", FaultAction::kDelay},
      {"drop", FaultAction::kDrop},     {"bitflip", FaultAction::kBitflip},
      {"evict", FaultAction::kEvict},   {"partition", FaultAction::kPartition},
      {"heal", FaultAction::kHeal},     {"restart", FaultAction::kRestart}};
  f->action = kActions.at(action);
  if (f->action == FaultAction::kRestart && s.workload.kind != WorkloadKind::kPagestore) {
    return rd.Error(rd.Line(t, "action"),
                    "restart needs a pagestore workload (its store joins the fresh server)");
  }
  const toml::node* tn = t.get("target");
  if (tn == nullptr) return rd.Error(t.source(), "[[fault]] needs target (server:N, rack:N, ...)");
  TESSERA_ASSIGN_OR_RETURN(f->target, ParseTarget(rd, *tn));
  const int n = s.cluster.memservers;
  switch (f->target.kind) {
    case TargetKind::kServer:
      if (f->target.n >= static_cast<uint64_t>(n)) {
        return rd.Error(tn->source(), "target " + f->target.text + ": the cluster has servers 0.." +
                                          std::to_string(n - 1));
      }
      break;
    case TargetKind::kRandom:
      if (f->target.n < 1 || f->target.n > static_cast<uint64_t>(n)) {
        return rd.Error(tn->source(), "target " + f->target.text +
                                          ": random:N needs 1 <= N <= " + std::to_string(n));
      }
      break;
    case TargetKind::kRack:
      if (s.cluster.racks == 0) {
        return rd.Error(tn->source(), "target " + f->target.text +
                                          ": the cluster has no racks (set [cluster] racks)");
      }
      if (f->target.n >= static_cast<uint64_t>(s.cluster.racks)) {
        return rd.Error(tn->source(), "target " + f->target.text + ": the cluster has racks 0.." +
                                          std::to_string(s.cluster.racks - 1));
      }
      break;
    case TargetKind::kAggregator:
      if (s.workload.kind != WorkloadKind::kParamsvc) {
        return rd.Error(tn->source(), "target aggregator needs a paramsvc workload");
      }
      if (f->action != FaultAction::kKill && f->action != FaultAction::kStop &&
          f->action != FaultAction::kResume) {
        return rd.Error(tn->source(), "the aggregator can be killed, stopped or resumed only");
      }
      break;
    case TargetKind::kEtcd:
      if (s.cluster.membership != "etcd") {
        return rd.Error(tn->source(),
                        "target etcd needs [cluster] membership = \"etcd\" (the runner's etcd)");
      }
      if (f->action != FaultAction::kKill && f->action != FaultAction::kStop &&
          f->action != FaultAction::kResume) {
        return rd.Error(tn->source(), "etcd can be killed, stopped or resumed only");
      }
      break;
    case TargetKind::kClient:
      if (s.workload.kind != WorkloadKind::kPagestore || s.workload.pagestore.client_pages == 0) {
        return rd.Error(tn->source(),
                        "target client needs a pagestore workload with client_pages (the "
                        "client process it kills)");
      }
      if (f->action != FaultAction::kKill) {
        return rd.Error(tn->source(),
                        "the client can be killed only (it is restarted at once, as a new "
                        "process)");
      }
      break;
    case TargetKind::kPage:
      if (s.workload.kind != WorkloadKind::kPagestore) {
        return rd.Error(tn->source(), "target page:P needs a pagestore workload");
      }
      if (f->target.n >= s.workload.pagestore.pages) {
        return rd.Error(tn->source(), "target " + f->target.text + ": the workload has pages 0.." +
                                          std::to_string(s.workload.pagestore.pages - 1));
      }
      break;
  }
  TRY_ASSIGN(f->count, rd.Int(t, "count", 1, 20));
  if (t.contains("count") && f->target.kind != TargetKind::kPage) {
    return rd.Error(rd.Line(t, "count"), "count applies to page:P targets only");
  }
  TRY_ASSIGN(f->delay, rd.Str(t, "delay"));
  if (t.contains("delay") && (f->action != FaultAction::kDelay || !IsDuration(f->delay))) {
    return rd.Error(rd.Line(t, "delay"), f->action != FaultAction::kDelay
                                             ? "delay applies to action = \"delay\" only"
                                             : "delay must be a duration like 500us, 1ms, 2s");
  }
  TRY_ASSIGN(f->duration_s, rd.Num(t, "duration_s", 0.01, 1e6));
  const bool etcd_kill = f->action == FaultAction::kKill && f->target.kind == TargetKind::kEtcd;
  if (t.contains("duration_s") &&
      !(f->action == FaultAction::kStop || f->action == FaultAction::kDelay ||
        f->action == FaultAction::kDrop || f->action == FaultAction::kPartition || etcd_kill)) {
    return rd.Error(rd.Line(t, "duration_s"),
                    "duration_s applies to stop, delay, drop, partition and a kill of etcd only");
  }
  TRY_ASSIGN(f->bits, rd.Int(t, "bits", 1, 1 << 20));
  if (t.contains("bits") && f->action != FaultAction::kBitflip) {
    return rd.Error(rd.Line(t, "bits"), "bits applies to action = \"bitflip\" only");
  }
  TRY_ASSIGN(f->slabs, rd.Int(t, "slabs", 1, 1 << 20));
  if (t.contains("slabs") && f->action != FaultAction::kEvict) {
    return rd.Error(rd.Line(t, "slabs"), "slabs applies to action = \"evict\" only");
  }
  return Status::Ok();
}

}  // namespace

const char* FaultActionName(FaultAction a) {
  switch (a) {
    case FaultAction::kKill:
      return "kill";
    case FaultAction::kStop:
      return "stop";
    case FaultAction::kResume:
      return "resume";
    case FaultAction::kDelay:
      return "delay";
    case FaultAction::kDrop:
      return "drop";
    case FaultAction::kBitflip:
      return "bitflip";
    case FaultAction::kEvict:
      return "evict";
    case FaultAction::kPartition:
      return "partition";
    case FaultAction::kHeal:
      return "heal";
    case FaultAction::kRestart:
      return "restart";
  }
  return "?";
}

Result<Scenario> ParseScenario(const std::string& text, const std::string& origin) {
  Reader rd(origin);
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    return rd.Error(e.source(), std::string(e.description()));
  }
  Scenario s;
  s.source = text;
  s.origin = origin;
  TESSERA_RETURN_IF_ERROR(rd.Keys(root, "the scenario",
                                  {"name", "description", "seed", "duration_s", "cluster",
                                   "workload", "fault", "expect", "variant", "quick"}));
  TRY_ASSIGN(s.name, rd.Str(root, "name"));
  if (s.name.empty()) return rd.Error(1, "the scenario needs name = \"...\"");
  TRY_ASSIGN(s.description, rd.Str(root, "description"));
  int64_t seed = 1;
  TRY_ASSIGN(seed, rd.Int(root, "seed", 0, INT64_MAX));
  s.seed = static_cast<uint64_t>(seed);
  std::optional<double> duration;
  TRY_ASSIGN(duration, rd.Num(root, "duration_s", 0.1, 86400));
  if (!duration) return rd.Error(1, "the scenario needs duration_s (an upper bound, seconds)");
  s.duration_s = *duration;

  const toml::table* cluster = nullptr;
  TESSERA_ASSIGN_OR_RETURN(cluster, rd.Table(root, "cluster"));
  if (cluster == nullptr) return rd.Error(1, "the scenario needs a [cluster] table");
  TESSERA_RETURN_IF_ERROR(ParseCluster(rd, *cluster, &s.cluster));

  const toml::table* workload = nullptr;
  TESSERA_ASSIGN_OR_RETURN(workload, rd.Table(root, "workload"));
  if (workload == nullptr) return rd.Error(1, "the scenario needs a [workload] table");
  std::map<std::string, int> seen;
  WorkloadKeys keys;
  TESSERA_RETURN_IF_ERROR(ParseWorkloadKeys(rd, *workload, "[workload]", &keys, &seen));
  TESSERA_RETURN_IF_ERROR(CheckWorkload(rd, *workload, keys));
  if (keys.kind == "kv" && !workload->contains("mode")) keys.mode = KvOptions().mode;
  s.workload = ToSpec(keys);
  if (s.workload.kind == WorkloadKind::kKv && s.workload.kv.replicas > s.cluster.memservers) {
    return rd.Error(rd.Line(*workload, "replicas"), "replicas (" +
                                                        std::to_string(s.workload.kv.replicas) +
                                                        ") must be at most memservers (" +
                                                        std::to_string(s.cluster.memservers) + ")");
  }

  if (s.cluster.membership == "etcd" && s.workload.kind != WorkloadKind::kPagestore) {
    return rd.Error(rd.Line(*cluster, "membership"),
                    "membership = \"etcd\" needs a pagestore workload (the store that follows "
                    "it)");
  }
  if (const toml::node* f = root.get("fault")) {
    const toml::array* arr = f->as_array();
    if (arr == nullptr || !arr->is_array_of_tables()) {
      return rd.Error(f->source(), "fault must be written as [[fault]] tables");
    }
    for (const toml::node& e : *arr) {
      FaultSpec fs;
      TESSERA_RETURN_IF_ERROR(ParseFault(rd, *e.as_table(), s, &fs));
      s.faults.push_back(fs);
    }
  }

  const toml::table* expect = nullptr;
  TESSERA_ASSIGN_OR_RETURN(expect, rd.Table(root, "expect"));
  if (expect != nullptr) {
    TESSERA_RETURN_IF_ERROR(ParseExpect(rd, *expect, "[expect]", &s.expect));
    TESSERA_RETURN_IF_ERROR(CheckExpect(rd, *expect, s.expect, s.workload.kind));
  }

  if (const toml::node* v = root.get("variant")) {
    const toml::array* arr = v->as_array();
    if (arr == nullptr || !arr->is_array_of_tables()) {
      return rd.Error(v->source(), "variant must be written as [[variant]] tables");
    }
    std::set<std::string> names;
    for (const toml::node& e : *arr) {
      const toml::table& t = *e.as_table();
      TESSERA_RETURN_IF_ERROR(
          rd.Keys(t, "[[variant]]", {"name", "delta", "placement", "layout", "expect"}));
      VariantSpec vs;
      TRY_ASSIGN(vs.name, rd.Str(t, "name"));
      if (vs.name.empty()) return rd.Error(t.source(), "[[variant]] needs name");
      if (vs.name.find_first_of("/ \t") != std::string::npos) {
        return rd.Error(rd.Line(t, "name"), "a variant name must not contain '/' or spaces");
      }
      if (!names.insert(vs.name).second) {
        return rd.Error(rd.Line(t, "name"), "variant '" + vs.name + "' is named twice");
      }
      std::optional<int64_t> delta;
      TRY_ASSIGN(delta, rd.Int(t, "delta", 0, 4));
      if (delta) vs.delta = static_cast<int>(*delta);
      std::optional<std::string> placement;
      TRY_ASSIGN(placement, rd.Str(t, "placement", {"codingsets", "random"}));
      if (placement) vs.placement = placement;
      std::optional<std::string> layout;
      TRY_ASSIGN(layout, rd.Str(t, "layout", {"split", "group"}));
      if (layout) vs.layout = layout;
      const toml::table* ve = nullptr;
      TESSERA_ASSIGN_OR_RETURN(ve, rd.Table(t, "expect"));
      if (ve != nullptr) {
        TESSERA_RETURN_IF_ERROR(ParseExpect(rd, *ve, "[variant.expect]", &vs.expect));
        TESSERA_RETURN_IF_ERROR(CheckExpect(rd, *ve, vs.expect, s.workload.kind));
        vs.has_expect = true;
      }
      s.variants.push_back(vs);
    }
    // Cross-variant references must name a variant.
    for (size_t i = 0; i < s.variants.size(); ++i) {
      const ExpectSpec& e = s.variants[i].expect;
      for (const std::string* ref :
           {&e.p99_below_variant, &e.fewer_lost_than_variant, &e.throughput_above_variant}) {
        if (!ref->empty() && (names.count(*ref) == 0 || *ref == s.variants[i].name)) {
          return rd.Error(arr->get(i)->source(), "variant '" + s.variants[i].name +
                                                     "' compares with '" + *ref +
                                                     "', which is not another variant");
        }
      }
    }
  }
  if (!s.expect.p99_below_variant.empty() || !s.expect.fewer_lost_than_variant.empty() ||
      !s.expect.throughput_above_variant.empty()) {
    return rd.Error(rd.Line(root, "expect"),
                    "p99_below_variant, throughput_above_variant and fewer_lost_than_variant "
                    "compare variants: they belong in [variant.expect]");
  }

  const toml::table* quick = nullptr;
  TESSERA_ASSIGN_OR_RETURN(quick, rd.Table(root, "quick"));
  if (quick != nullptr) {
    TESSERA_RETURN_IF_ERROR(
        rd.Keys(*quick, "[quick]", {"duration_s", "time_scale", "workload", "expect"}));
    s.quick.present = true;
    std::optional<double> qd;
    TRY_ASSIGN(qd, rd.Num(*quick, "duration_s", 0.1, 86400));
    s.quick.duration_s = qd;
    TRY_ASSIGN(s.quick.time_scale, rd.Num(*quick, "time_scale", 0.001, 1.0));
    const toml::table* qw = nullptr;
    TESSERA_ASSIGN_OR_RETURN(qw, rd.Table(*quick, "workload"));
    if (qw != nullptr) {
      if (qw->contains("kind")) {
        return rd.Error(rd.Line(*qw, "kind"), "[quick.workload] cannot change the kind");
      }
      WorkloadKeys quick_keys = keys;
      TESSERA_RETURN_IF_ERROR(
          ParseWorkloadKeys(rd, *qw, "[quick.workload]", &quick_keys, &s.quick.workload_keys_line));
      TESSERA_RETURN_IF_ERROR(CheckWorkload(rd, *qw, quick_keys));
      s.quick.workload = ToSpec(quick_keys);
    }
    const toml::table* qe = nullptr;
    TESSERA_ASSIGN_OR_RETURN(qe, rd.Table(*quick, "expect"));
    if (qe != nullptr) {
      TESSERA_RETURN_IF_ERROR(ParseExpect(rd, *qe, "[quick.expect]", &s.quick.expect));
      TESSERA_RETURN_IF_ERROR(CheckExpect(rd, *qe, s.quick.expect, s.workload.kind));
      if (!s.quick.expect.p99_below_variant.empty() ||
          !s.quick.expect.fewer_lost_than_variant.empty() ||
          !s.quick.expect.throughput_above_variant.empty()) {
        return rd.Error(qe->source(), "[quick.expect] cannot hold variant comparisons");
      }
      s.quick.has_expect = true;
    }
    Scenario q = ApplyQuick(s);
    for (const FaultSpec& f : q.faults) {
      if (f.at_s && *f.at_s >= q.duration_s) {
        return rd.Error(f.line, "with [quick], this fault's at_s (" + std::to_string(*f.at_s) +
                                    ") is not before duration_s");
      }
      if (f.target.kind == TargetKind::kPage && f.target.n >= q.workload.pagestore.pages) {
        return rd.Error(f.line, "with [quick], target " + f.target.text + " is beyond the pages");
      }
    }
  }
  return s;
}

Scenario ApplyQuick(const Scenario& s) {
  if (!s.quick.present) return s;
  Scenario q = s;
  if (s.quick.duration_s) q.duration_s = *s.quick.duration_s;
  for (FaultSpec& f : q.faults) {
    if (f.at_s) *f.at_s *= s.quick.time_scale;
    f.duration_s *= s.quick.time_scale;
  }
  if (s.quick.has_expect) {
    // Each bound given in [quick.expect] replaces the same bound of [expect] and of every
    // variant's expect that has it.
    auto merge = [&](ExpectSpec* e, bool only_present) {
      const ExpectSpec& q2 = s.quick.expect;
      auto take = [only_present](auto& to, const auto& from) {
        if (from && (!only_present || to)) to = from;
      };
      take(e->data_loss, q2.data_loss);
      take(e->wrong_bytes, q2.wrong_bytes);
      take(e->identical_output, q2.identical_output);
      take(e->max_p99_us_during_faults, q2.max_p99_us_during_faults);
      take(e->max_p99_ratio_during_faults, q2.max_p99_ratio_during_faults);
      take(e->min_throughput_ratio_during_faults, q2.min_throughput_ratio_during_faults);
      take(e->regenerated_within_s, q2.regenerated_within_s);
      take(e->max_slowdown_vs_healthy, q2.max_slowdown_vs_healthy);
      take(e->corruptions_repaired_all, q2.corruptions_repaired_all);
      take(e->data_loss_exactly_affected, q2.data_loss_exactly_affected);
      take(e->max_loss_error_vs_prediction, q2.max_loss_error_vs_prediction);
      take(e->slabs_back_to_baseline, q2.slabs_back_to_baseline);
      take(e->false_failures, q2.false_failures);
    };
    merge(&q.expect, false);
    for (VariantSpec& v : q.variants) merge(&v.expect, true);
  }
  if (!s.quick.workload_keys_line.empty()) q.workload = s.quick.workload;
  return q;
}

ClusterSpec VariantCluster(const Scenario& s, const VariantSpec* v) {
  ClusterSpec c = s.cluster;
  if (v == nullptr) return c;
  if (v->delta) c.delta = *v->delta;
  if (v->placement) c.placement = *v->placement;
  if (v->layout) c.layout = *v->layout;
  return c;
}

}  // namespace tessera::experiment
