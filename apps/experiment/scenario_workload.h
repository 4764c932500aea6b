// The [workload] table of a scenario: its keys as read, the checks of which keys belong to
// which kind, and the kind's options made of them. Internal to apps/experiment/: the scenario
// parser.
//
// Threads: free functions; any thread.
#pragma once

#include <map>
#include <string>

#include "apps/experiment/scenario.h"
#include "apps/experiment/scenario_reader.h"

namespace tessera::experiment {

// A [workload] table as read, before the checks of its kind: every kind's options, and the
// keys two kinds share, which ToSpec sorts into the kind's options.
struct WorkloadKeys {
  std::string kind;
  ProgramOptions run;
  PagestoreOptions pagestore;
  ParamsvcOptions paramsvc;
  KvOptions kv;
  std::string mode = "sync";  // paramsvc: sync | async; kv: kv | rpc | pushback | kayak
  uint64_t ops = 0;           // pagestore, kv
  bool verify_at_end = true;  // pagestore, kv
};

// Reads the workload keys present in `t` (the table `where`) into `w`; `seen` gets each key
// found with its line.
Status ParseWorkloadKeys(const Reader& rd, const toml::table& t, const std::string& where,
                         WorkloadKeys* w, std::map<std::string, int>* seen);

// Checks that `w` (read from `t`) has what its kind needs and no key of another kind.
Status CheckWorkload(const Reader& rd, const toml::table& t, const WorkloadKeys& w);

// The options of the kind `w` names (CheckWorkload has passed); the other kinds' keep their
// defaults.
WorkloadSpec ToSpec(const WorkloadKeys& w);

}  // namespace tessera::experiment
