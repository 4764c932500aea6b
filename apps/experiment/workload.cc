#include "apps/experiment/workload.h"

#include <algorithm>
#include <thread>

#include "common/clock.h"

namespace tessera::experiment {

void RunContext::Event(const std::string& line) {
  std::lock_guard<std::mutex> l(mu_);
  events_.push_back(line);
}

bool RunContext::HasEvent(const std::string& substring) const {
  std::lock_guard<std::mutex> l(mu_);
  for (const std::string& e : events_) {
    if (e.find(substring) != std::string::npos) return true;
  }
  return false;
}

void PhaseLatency::Record(uint64_t ns, int start_phase, int end_phase) {
  end_phase = std::clamp(end_phase, 0, 2);
  std::lock_guard<std::mutex> l(mu_);
  interval_.Record(ns);
  phase_[(start_phase == 1 || end_phase == 1) ? 1 : end_phase].Record(ns);
}

void PhaseLatency::RecordInterval(uint64_t ns) {
  std::lock_guard<std::mutex> l(mu_);
  interval_.Record(ns);
}

void PhaseLatency::TakeInterval(WorkloadSample* s) {
  std::lock_guard<std::mutex> l(mu_);
  s->p50_us = static_cast<double>(interval_.p50()) / 1e3;
  s->p99_us = static_cast<double>(interval_.p99()) / 1e3;
  interval_.Clear();
}

void PhaseLatency::SetResult(RunResult* r) const {
  std::lock_guard<std::mutex> l(mu_);
  SetPhaseLatencies(phase_[0], phase_[1], r);
}

WorkloadSample CountedSample(uint64_t ops, uint64_t data_loss, PhaseLatency& latency) {
  WorkloadSample s;
  s.ops = ops;
  latency.TakeInterval(&s);
  s.data_loss = data_loss;
  return s;
}

void RunThreads(size_t n, const std::function<void(size_t)>& body) {
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) threads.emplace_back([&body, i] { body(i); });
  for (std::thread& t : threads) t.join();
}

std::vector<std::string> ExpandCommand(const std::vector<std::string>& cmd,
                                       const std::string& data_dir) {
  std::vector<std::string> out;
  for (std::string a : cmd) {
    const std::string key = "${data_dir}";
    for (size_t pos; (pos = a.find(key)) != std::string::npos;)
      a.replace(pos, key.size(), data_dir);
    out.push_back(a);
  }
  return out;
}

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double NowS() { return static_cast<double>(MonotonicNs()) * 1e-9; }

Status NoLayout(const Scenario& s) {
  auto check = [&](const std::string& l) -> Status {
    if (l.empty()) return Status::Ok();
    return Unsupported("layout applies to kind = \"pagestore\", \"run\" and \"swap\" only (kind = \"",
                       WorkloadKindName(s.workload.kind),
                       "\" uses its own store's default layout)");
  };
  TESSERA_RETURN_IF_ERROR(check(s.cluster.layout));
  for (const VariantSpec& v : s.variants) {
    if (v.layout) TESSERA_RETURN_IF_ERROR(check(*v.layout));
  }
  return Status::Ok();
}

}  // namespace tessera::experiment
