#include "apps/experiment/scenario_workload.h"

#include <algorithm>
#include <cctype>
#include <utility>

namespace tessera::experiment {
namespace {

// The kinds and their names in scenario files.
constexpr std::pair<WorkloadKind, const char*> kKindNames[] = {
    {WorkloadKind::kRun, "run"},
    {WorkloadKind::kSwap, "swap"},
    {WorkloadKind::kPagestore, "pagestore"},
    {WorkloadKind::kKv, "kv"},
    {WorkloadKind::kParamsvc, "paramsvc"}};

constexpr std::initializer_list<const char*> kWorkloadKeys = {
    "kind",          "command",       "local_memory", "pages",      "qd",       "read_ratio", "ops",
    "verify_at_end", "verify_passes", "workers",      "iterations", "elements", "mode",
    "keys",          "value_size",    "replicas",     "clients",    "put_ratio", "invoke_ratio",
    "hops",          "client_pages"};

}  // namespace

const char* WorkloadKindName(WorkloadKind k) {
  for (const auto& [kind, name] : kKindNames) {
    if (kind == k) return name;
  }
  return "?";
}

Result<WorkloadKind> ParseWorkloadKind(const std::string& name) {
  std::string list;
  for (const auto& [kind, n] : kKindNames) {
    if (name == n) return kind;
    list += std::string(list.empty() ? "" : ", ") + n;
  }
  return InvalidArgument("kind must be one of ", list, ", got '", name, "'");
}

Status ParseWorkloadKeys(const Reader& rd, const toml::table& t, const std::string& where,
                         WorkloadKeys* w, std::map<std::string, int>* seen) {
  TESSERA_RETURN_IF_ERROR(rd.Keys(t, where, kWorkloadKeys));
  for (const auto& [key, node] : t) (*seen)[std::string(key.str())] = node.source().begin.line;
  TRY_ASSIGN(w->kind, rd.Str(t, "kind"));
  if (t.contains("kind")) {
    auto kind = ParseWorkloadKind(w->kind);
    if (!kind.ok()) return rd.Error(rd.Line(t, "kind"), kind.status().message());
  }
  if (const toml::node* n = t.get("command")) {
    const toml::array* a = n->as_array();
    if (a == nullptr || a->empty()) {
      return rd.Error(n->source(), "command must be a non-empty array of strings");
    }
    w->run.command.clear();
    for (const toml::node& e : *a) {
      auto s = e.value_exact<std::string>();
      if (!s) return rd.Error(e.source(), "command must be an array of strings");
      w->run.command.push_back(*s);
    }
  }
  TRY_ASSIGN(w->run.local_memory, rd.Str(t, "local_memory"));
  if (t.contains("local_memory")) {
    const std::string& m = w->run.local_memory;
    bool pct = !m.empty() && m.back() == '%' && m.size() > 1 &&
               std::all_of(m.begin(), m.end() - 1, [](char c) { return std::isdigit(c); });
    if (!pct && !IsSize(m)) {
      return rd.Error(rd.Line(t, "local_memory"),
                      "local_memory must be a percentage (50%) or a size (256M), got '" + m + "'");
    }
  }
  int64_t pages = -1;
  TRY_ASSIGN(pages, rd.Int(t, "pages", 16, 1 << 24));
  if (pages >= 0) w->pagestore.pages = static_cast<uint64_t>(pages);
  TRY_ASSIGN(w->pagestore.qd, rd.Int(t, "qd", 1, 1024));
  TRY_ASSIGN(w->pagestore.read_ratio, rd.Num(t, "read_ratio", 0.0, 1.0));
  int64_t ops = -1;
  TRY_ASSIGN(ops, rd.Int(t, "ops", 0, int64_t{1} << 40));
  if (ops >= 0) w->ops = static_cast<uint64_t>(ops);
  TRY_ASSIGN(w->verify_at_end, rd.Bool(t, "verify_at_end"));
  TRY_ASSIGN(w->pagestore.verify_passes, rd.Int(t, "verify_passes", 1, 10));
  int64_t client_pages = -1;
  TRY_ASSIGN(client_pages, rd.Int(t, "client_pages", 16, 1 << 20));
  if (client_pages > 0) w->pagestore.client_pages = static_cast<uint64_t>(client_pages);
  TRY_ASSIGN(w->paramsvc.workers, rd.Int(t, "workers", 1, 16));
  int64_t iterations = -1;
  TRY_ASSIGN(iterations, rd.Int(t, "iterations", 1, int64_t{1} << 32));
  if (iterations > 0) w->paramsvc.iterations = static_cast<uint64_t>(iterations);
  int64_t elements = -1;
  TRY_ASSIGN(elements, rd.Int(t, "elements", 1, int64_t{1} << 26));
  if (elements > 0) w->paramsvc.elements = static_cast<uint64_t>(elements);
  TRY_ASSIGN(w->mode, rd.Str(t, "mode", {"sync", "async", "kv", "rpc", "pushback", "kayak"}));
  int64_t keys = -1;
  TRY_ASSIGN(keys, rd.Int(t, "keys", 1, int64_t{1} << 24));
  if (keys > 0) w->kv.keys = static_cast<uint64_t>(keys);
  int64_t value_size = -1;
  TRY_ASSIGN(value_size, rd.Int(t, "value_size", 16, 65536));
  if (value_size > 0) w->kv.value_size = static_cast<uint64_t>(value_size);
  TRY_ASSIGN(w->kv.replicas, rd.Int(t, "replicas", 1, 8));
  TRY_ASSIGN(w->kv.clients, rd.Int(t, "clients", 1, 64));
  TRY_ASSIGN(w->kv.put_ratio, rd.Num(t, "put_ratio", 0.0, 1.0));
  TRY_ASSIGN(w->kv.invoke_ratio, rd.Num(t, "invoke_ratio", 0.0, 1.0));
  TRY_ASSIGN(w->kv.hops, rd.Int(t, "hops", 1, 64));
  return Status::Ok();
}

Status CheckWorkload(const Reader& rd, const toml::table& t, const WorkloadKeys& w) {
  if (w.kind.empty()) {
    return rd.Error(t.source(), "[workload] needs kind (run, swap, pagestore, kv, paramsvc)");
  }
  const WorkloadKind kind = ParseWorkloadKind(w.kind).value();  // ParseWorkloadKeys checked it.
  using K = WorkloadKind;
  if (RunsAProgram(kind) && w.run.command.empty()) {
    return rd.Error(t.source(), "[workload] kind = \"" + w.kind +
                                    "\" needs command = [\"PROGRAM\", ...]");
  }
  if (kind == K::kPagestore && w.pagestore.pages == 0) {
    return rd.Error(t.source(), "[workload] kind = \"pagestore\" needs pages");
  }
  if (!RunsAProgram(kind) && (t.contains("command") || t.contains("local_memory"))) {
    return rd.Error(rd.Line(t, t.contains("command") ? "command" : "local_memory"),
                    "command and local_memory apply to kind = \"run\" and \"swap\" only");
  }
  if (kind != K::kPagestore) {
    for (const char* k : {"pages", "qd", "read_ratio", "verify_passes", "client_pages"}) {
      if (t.contains(k)) {
        return rd.Error(rd.Line(t, k), std::string(k) + " applies to kind = \"pagestore\" only");
      }
    }
  }
  if (kind != K::kPagestore && kind != K::kKv) {
    for (const char* k : {"ops", "verify_at_end"}) {
      if (t.contains(k)) {
        return rd.Error(rd.Line(t, k),
                        std::string(k) + " applies to kind = \"pagestore\" and \"kv\" only");
      }
    }
  }
  if (kind != K::kKv) {
    for (const char* k :
         {"keys", "value_size", "replicas", "clients", "put_ratio", "invoke_ratio", "hops"}) {
      if (t.contains(k)) {
        return rd.Error(rd.Line(t, k), std::string(k) + " applies to kind = \"kv\" only");
      }
    }
  }
  if (kind == K::kKv) {
    if (t.contains("mode") && w.mode != "kv" && w.mode != "rpc" && w.mode != "pushback" &&
        w.mode != "kayak") {
      return rd.Error(rd.Line(t, "mode"),
                      "mode for kind = \"kv\" must be one of kv, rpc, pushback, kayak");
    }
    if (w.kv.put_ratio + w.kv.invoke_ratio > 1.0) {
      return rd.Error(rd.Line(t, t.contains("invoke_ratio") ? "invoke_ratio" : "put_ratio"),
                      "put_ratio + invoke_ratio must be at most 1 (the rest are GETs)");
    }
  }
  if (kind == K::kParamsvc && t.contains("mode") && w.mode != "sync" && w.mode != "async") {
    return rd.Error(rd.Line(t, "mode"), "mode for kind = \"paramsvc\" must be sync or async");
  }
  if (kind == K::kParamsvc && w.paramsvc.iterations == 0) {
    return rd.Error(t.source(), "[workload] kind = \"paramsvc\" needs iterations");
  }
  if (kind != K::kParamsvc) {
    for (const char* k : {"workers", "iterations", "elements"}) {
      if (t.contains(k)) {
        return rd.Error(rd.Line(t, k), std::string(k) + " applies to kind = \"paramsvc\" only");
      }
    }
  }
  if (kind != K::kParamsvc && kind != K::kKv && t.contains("mode")) {
    return rd.Error(rd.Line(t, "mode"), "mode applies to kind = \"paramsvc\" and \"kv\" only");
  }
  return Status::Ok();
}

WorkloadSpec ToSpec(const WorkloadKeys& w) {
  WorkloadSpec spec;
  spec.kind = ParseWorkloadKind(w.kind).value();
  switch (spec.kind) {
    case WorkloadKind::kRun:
    case WorkloadKind::kSwap:
      spec.run = w.run;
      break;
    case WorkloadKind::kPagestore:
      spec.pagestore = w.pagestore;
      spec.pagestore.ops = w.ops;
      spec.pagestore.verify_at_end = w.verify_at_end;
      break;
    case WorkloadKind::kParamsvc:
      spec.paramsvc = w.paramsvc;
      spec.paramsvc.mode = w.mode == "async" ? ParamsvcMode::kAsync : ParamsvcMode::kSync;
      break;
    case WorkloadKind::kKv:
      spec.kv = w.kv;
      spec.kv.mode = w.mode;
      spec.kv.ops = w.ops;
      spec.kv.verify_at_end = w.verify_at_end;
      break;
  }
  return spec;
}

}  // namespace tessera::experiment
