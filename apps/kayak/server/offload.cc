#include "apps/kayak/server/offload.h"

#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <sstream>

#include "common/clock.h"
#include "common/logging.h"
#include "apps/kayak/wire/builtins.h"

#ifndef sigev_notify_thread_id
#define sigev_notify_thread_id _sigev_un._tid
#endif

namespace tessera::kayak {
namespace {

namespace bi = builtins;

constexpr uint32_t kUserOutCap = 1u << 20;  // Result bytes an operator's function may write.

// CPU time the calling thread has used (a system call, unlike MonotonicNs()).
uint64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// The time one run may take, from its start. kThreadCpu (a worker's run) counts only the CPU
// time the running thread uses: time it waits for a CPU on a loaded machine is not the
// function's doing and must not stop it. kWall (an inline run on an I/O thread) counts wall time.
// A thread's CPU time never grows faster than wall time, so Expired() reads only the cheap wall
// clock until the budget has passed in wall time, and the thread's CPU clock from then on.
class RunBudget {
 public:
  enum class Clock { kWall, kThreadCpu };
  RunBudget(uint64_t budget_ns, Clock clock)
      : budget_ns_(budget_ns), clock_(clock), wall_deadline_ns_(MonotonicNs() + budget_ns),
        cpu_start_ns_(clock == Clock::kThreadCpu ? ThreadCpuNs() : 0) {}
  bool Expired() {
    const uint64_t now = MonotonicNs();
    if (now <= wall_deadline_ns_) return false;
    if (clock_ == Clock::kWall) return true;
    const uint64_t used = ThreadCpuNs() - cpu_start_ns_;
    if (used > budget_ns_) return true;
    // Not yet: the rest of the budget cannot be used up before this much more wall time.
    wall_deadline_ns_ = now + (budget_ns_ - used);
    return false;
  }

 private:
  const uint64_t budget_ns_;
  const Clock clock_;
  uint64_t wall_deadline_ns_;
  const uint64_t cpu_start_ns_;
};

// ---- the transaction a function runs in ----

class Txn {
 public:
  // track_reads = false for a function known to be read-only (a built-in): its reads need no
  // validation, so they are not recorded.
  Txn(KvStore* store, uint32_t table, RunBudget budget, bool track_reads = true)
      : store_(store), table_id_(table), table_(store->Table(table, false)), budget_(budget),
        track_reads_(track_reads) {}

  // Found or not; the value in *out. Reads see the transaction's own writes.
  bool Get(std::span<const uint8_t> key, std::vector<uint8_t>* out) {
    if (table_ == nullptr) table_ = store_->Table(table_id_, false);
    if (!track_reads_) return table_ != nullptr && table_->Get(key, out) != 0;
    std::string k(reinterpret_cast<const char*>(key.data()), key.size());
    auto w = writes_.find(k);
    if (w != writes_.end()) {
      if (!w->second) return false;
      *out = *w->second;
      return true;
    }
    uint64_t version = table_ != nullptr ? table_->Get(key, out) : 0;
    auto [it, inserted] = reads_.emplace(k, version);
    if (!inserted && it->second != version) inconsistent_ = true;  // Will fail validation.
    return version != 0;
  }
  void Put(std::span<const uint8_t> key, std::span<const uint8_t> value) {
    TCHECK(track_reads_) << "a write in a transaction opened read-only";
    writes_[std::string(reinterpret_cast<const char*>(key.data()), key.size())] =
        std::vector<uint8_t>(value.begin(), value.end());
  }
  void Delete(std::span<const uint8_t> key) {
    TCHECK(track_reads_) << "a delete in a transaction opened read-only";
    writes_[std::string(reinterpret_cast<const char*>(key.data()), key.size())] = std::nullopt;
  }
  bool Expired() { return budget_.Expired(); }
  bool HasWrites() const { return !writes_.empty(); }

  // True when committed (or nothing to commit), false on a conflict.
  Result<bool> Commit() {
    if (writes_.empty()) return true;
    if (inconsistent_) return false;
    KvTable* t = store_->Table(table_id_, true);
    std::vector<KvTable::ReadItem> reads;
    for (auto& [k, v] : reads_) {
      reads.push_back({{reinterpret_cast<const uint8_t*>(k.data()), k.size()}, v});
    }
    std::vector<KvTable::WriteItem> writes;
    for (auto& [k, v] : writes_) {
      KvTable::WriteItem w;
      w.key = {reinterpret_cast<const uint8_t*>(k.data()), k.size()};
      if (v) {
        w.value = *v;
      } else {
        w.is_delete = true;
      }
      writes.push_back(w);
    }
    TESSERA_ASSIGN_OR_RETURN(KvTable::WriteResult r, t->Commit(reads, writes));
    return !r.conflict;
  }

 private:
  KvStore* const store_;
  const uint32_t table_id_;
  KvTable* table_;
  RunBudget budget_;
  const bool track_reads_;
  std::map<std::string, uint64_t> reads_;
  std::map<std::string, std::optional<std::vector<uint8_t>>> writes_;
  bool inconsistent_ = false;
};

Status BudgetExceeded(uint32_t id, uint64_t budget_ns) {
  return Timeout("offload function ", id, " (", bi::Name(id), ") stopped: ran past its budget of ",
                 budget_ns / 1000, " us of CPU time");
}

Result<std::vector<uint8_t>> RunBuiltin(Txn& t, uint32_t id, std::span<const uint8_t> args,
                                        uint64_t budget_ns) {
  std::vector<uint8_t> value;
  if (id == bi::kMultiGetAggregate) {
    TESSERA_ASSIGN_OR_RETURN(bi::AggregateArgs a, bi::AggregateArgs::Decode(args));
    bi::ChaseResult r{0, bi::kDigestSeed};
    for (uint64_t key : a.keys) {
      if (t.Expired()) return BudgetExceeded(id, budget_ns);
      if (t.Get(bi::KeyBytes(key), &value)) {
        ++r.last_key;
        r.value = bi::Fold(r.value, value);
      }
    }
    return r.Encode();
  }
  TESSERA_ASSIGN_OR_RETURN(bi::ChaseArgs a, bi::ChaseArgs::Decode(id, args));
  uint64_t key = a.start;
  uint64_t last = key;
  uint64_t digest = bi::kDigestSeed;
  for (uint32_t hop = 0; hop < a.hops; ++hop) {
    if (t.Expired()) return BudgetExceeded(id, budget_ns);
    if (!t.Get(bi::KeyBytes(key), &value)) {
      return NotFound(bi::Name(id), ": chain broken at hop ", hop, ": key ", key, " is absent");
    }
    digest = bi::Fold(digest, value);
    last = key;
    if (hop + 1 < a.hops) {
      TESSERA_ASSIGN_OR_RETURN(key, bi::NextKey(key, value));
    }
  }
  if (id == bi::kChaseIncrement) {
    uint64_t counter = 0;
    TESSERA_ASSIGN_OR_RETURN(std::vector<uint8_t> updated, bi::Incremented(last, value, &counter));
    t.Put(bi::KeyBytes(last), updated);
    return bi::ChaseResult{last, counter}.Encode();
  }
  if (id == bi::kChaseCompute) {
    bool expired = false;
    digest = bi::Compute(digest, a.compute_iters, [&] {
      expired = t.Expired();
      return !expired;
    });
    if (expired) return BudgetExceeded(id, budget_ns);
  }
  return bi::ChaseResult{last, digest}.Encode();
}

// ---- stopping operators' functions ----
//
// phase: 0 = not in a function; 1 = in the function's own code (a stop or fault jumps out at
// once); 2 = in a runtime call (locks, allocation: a stop is deferred to the call's return);
// 3 = copying from/to the function's buffers inside a runtime call (a fault jumps out, a stop
// is deferred).
enum StopKind { kNotStopped = 0, kStopBudget = 1, kStopFault = 2, kStopMisuse = 3 };

struct WorkerSignals {
  sigjmp_buf jmp;
  volatile sig_atomic_t phase = 0;
  volatile sig_atomic_t stop_pending = 0;
  timer_t timer{};
  bool timer_ok = false;
};
thread_local WorkerSignals* tls_signals = nullptr;

int StopSignal() { return SIGRTMIN + 3; }

void OnStopSignal(int) {
  WorkerSignals* s = tls_signals;
  if (s == nullptr) return;
  if (s->phase == 1) {
    s->phase = 0;
    siglongjmp(s->jmp, kStopBudget);
  }
  if (s->phase >= 2) s->stop_pending = 1;
}

void OnFaultSignal(int sig, siginfo_t*, void*) {
  WorkerSignals* s = tls_signals;
  if (s != nullptr && (s->phase == 1 || s->phase == 3)) {
    s->phase = 0;
    siglongjmp(s->jmp, kStopFault);
  }
  // Not an offload function's fault: the default action, as if no handler were installed (the
  // faulting instruction runs again and the process dies with the usual core dump).
  ::signal(sig, SIG_DFL);
}

std::once_flag g_install_stop, g_install_fault;

void InstallStopHandler() {
  std::call_once(g_install_stop, [] {
    struct sigaction sa {};
    sa.sa_handler = OnStopSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(StopSignal(), &sa, nullptr);
  });
}
void InstallFaultHandlers() {
  std::call_once(g_install_fault, [] {
    struct sigaction sa {};
    sa.sa_sigaction = OnFaultSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
  });
}

// What a trampoline sees behind the opaque tessera_kv*.
struct UserCall {
  Txn* txn = nullptr;
  WorkerSignals* signals = nullptr;
  std::vector<uint8_t> scratch;  // Values moving between the table and the function.
  std::string misuse;            // Why the function was stopped at a runtime call.
};

void Enter(UserCall* c) { c->signals->phase = 2; }
void Leave(UserCall* c) {
  c->signals->phase = 1;
  if (c->signals->stop_pending) {
    c->signals->phase = 0;
    siglongjmp(c->signals->jmp, kStopBudget);
  }
}
[[noreturn]] void Misuse(UserCall* c, const char* what) {
  c->misuse = what;
  c->signals->phase = 0;
  siglongjmp(c->signals->jmp, kStopMisuse);
}
// Copies between the function's memory and ours with faults contained.
void GuardedCopy(UserCall* c, void* dst, const void* src, size_t n) {
  c->signals->phase = 3;
  std::memcpy(dst, src, n);
  c->signals->phase = 2;
}

int ApiGet(tessera_kv* kv, const uint8_t* key, uint32_t key_len, uint8_t* buf, uint32_t buf_cap,
           uint32_t* value_len) {
  auto* c = reinterpret_cast<UserCall*>(kv);
  Enter(c);
  if (key == nullptr || key_len == 0 || key_len > kKvMaxKeyLength) {
    Misuse(c, "get: key length outside 1..64 or a NULL key");
  }
  if (value_len == nullptr || (buf == nullptr && buf_cap != 0)) {
    Misuse(c, "get: NULL value_len or buffer");
  }
  uint8_t k[kKvMaxKeyLength];
  GuardedCopy(c, k, key, key_len);
  bool found = c->txn->Get({k, key_len}, &c->scratch);
  int rc = TESSERA_OFFLOAD_NOT_FOUND;
  if (found) {
    uint32_t n = static_cast<uint32_t>(c->scratch.size());
    GuardedCopy(c, value_len, &n, sizeof(n));
    if (n > buf_cap) {
      rc = TESSERA_OFFLOAD_TOO_SMALL;
    } else {
      if (n > 0) GuardedCopy(c, buf, c->scratch.data(), n);
      rc = TESSERA_OFFLOAD_OK;
    }
  }
  Leave(c);
  return rc;
}

int ApiPut(tessera_kv* kv, const uint8_t* key, uint32_t key_len, const uint8_t* value,
           uint32_t value_len) {
  auto* c = reinterpret_cast<UserCall*>(kv);
  Enter(c);
  if (key == nullptr || key_len == 0 || key_len > kKvMaxKeyLength) {
    Misuse(c, "put: key length outside 1..64 or a NULL key");
  }
  if (value_len > kKvMaxValueLength || (value == nullptr && value_len != 0)) {
    Misuse(c, "put: value length above 65536 or a NULL value");
  }
  uint8_t k[kKvMaxKeyLength];
  GuardedCopy(c, k, key, key_len);
  c->scratch.resize(value_len);
  if (value_len > 0) GuardedCopy(c, c->scratch.data(), value, value_len);
  c->txn->Put({k, key_len}, c->scratch);
  Leave(c);
  return TESSERA_OFFLOAD_OK;
}

int ApiDel(tessera_kv* kv, const uint8_t* key, uint32_t key_len) {
  auto* c = reinterpret_cast<UserCall*>(kv);
  Enter(c);
  if (key == nullptr || key_len == 0 || key_len > kKvMaxKeyLength) {
    Misuse(c, "del: key length outside 1..64 or a NULL key");
  }
  uint8_t k[kKvMaxKeyLength];
  GuardedCopy(c, k, key, key_len);
  bool found = c->txn->Get({k, key_len}, &c->scratch);
  c->txn->Delete({k, key_len});
  Leave(c);
  return found ? TESSERA_OFFLOAD_OK : TESSERA_OFFLOAD_NOT_FOUND;
}

void ApiYield(tessera_kv* kv) {
  auto* c = reinterpret_cast<UserCall*>(kv);
  Enter(c);
  if (c->txn->Expired()) c->signals->stop_pending = 1;
  Leave(c);
}

const tessera_offload_api kApi = {TESSERA_OFFLOAD_ABI_VERSION, ApiGet, ApiPut, ApiDel, ApiYield};

thread_local std::vector<uint8_t>* tls_user_out = nullptr;

void ArmTimer(WorkerSignals* s, uint64_t ns) {
  if (!s->timer_ok) return;
  itimerspec its{};
  its.it_value.tv_sec = static_cast<time_t>(ns / 1000000000ull);
  its.it_value.tv_nsec = static_cast<long>(ns % 1000000000ull);
  if (ns == 0) its.it_value.tv_nsec = 1;
  // Keeps firing every millisecond (of the thread's CPU time) after expiry: a stop that lands in
  // a race window is retried.
  its.it_interval.tv_nsec = 1000000;
  timer_settime(s->timer, 0, &its, nullptr);
}
void DisarmTimer(WorkerSignals* s) {
  if (!s->timer_ok) return;
  itimerspec its{};
  timer_settime(s->timer, 0, &its, nullptr);
}

// Runs one attempt of an operator's function; `stop` says whether (and why) it was stopped.
// Locals live in `frame` (outside the jump) so nothing the jump skips owns memory.
struct UserFrame {
  UserCall call;
  uint32_t out_len = 0;
  int rc = 0;
  int stop = kNotStopped;
};

void RunUserOnce(tessera_offload_fn fn, std::span<const uint8_t> args, uint64_t budget_ns,
                 UserFrame* f) {
  WorkerSignals* s = f->call.signals;
  std::vector<uint8_t>& out = *tls_user_out;
  s->stop_pending = 0;
  int jumped = sigsetjmp(s->jmp, 1);
  if (jumped == 0) {
    ArmTimer(s, budget_ns);
    s->phase = 1;
    f->rc = fn(&kApi, reinterpret_cast<tessera_kv*>(&f->call), args.data(),
               static_cast<uint32_t>(args.size()), out.data(), kUserOutCap, &f->out_len);
    s->phase = 0;
    DisarmTimer(s);
    f->stop = kNotStopped;
  } else {
    DisarmTimer(s);
    s->phase = 0;
    s->stop_pending = 0;
    f->stop = jumped;
  }
}

}  // namespace

// ---- OffloadRuntime ----

OffloadRuntime::OffloadRuntime(KvStore* store, OffloadOptions options)
    : store_(store), options_(std::move(options)) {}

Result<std::unique_ptr<OffloadRuntime>> OffloadRuntime::Create(KvStore* store,
                                                               OffloadOptions options) {
  if (options.workers < 1 || options.workers > 64) {
    return InvalidArgument("offload workers must be in 1..64, got ", options.workers);
  }
  if (options.max_queue == 0 || options.hard_queue < options.max_queue) {
    return InvalidArgument("offload queue bound must be >= 1 and <= the hard bound");
  }
  if (options.budget_ns == 0) return InvalidArgument("offload budget must be positive");
  if (options.max_attempts == 0) return InvalidArgument("offload max_attempts must be >= 1");
  std::unique_ptr<OffloadRuntime> rt(new OffloadRuntime(store, options));
  if (rt->options_.inline_ns > 0) {
    // The compute rounds' speed on this machine (best of three short runs), for EstimateNs.
    uint64_t best = ~0ull;
    constexpr uint32_t kRounds = 20000;
    for (int i = 0; i < 3; ++i) {
      const uint64_t t0 = MonotonicNs();
      volatile uint64_t sink = bi::Compute(i, kRounds);
      (void)sink;
      best = std::min(best, MonotonicNs() - t0);
    }
    rt->compute_ns_per_iter_ = std::max(0.1, static_cast<double>(best) / kRounds);
  }
  for (const std::string& lib : rt->options_.libraries) {
    TESSERA_RETURN_IF_ERROR(rt->LoadLibrary(lib));
  }
  InstallStopHandler();
  if (!rt->user_.empty()) InstallFaultHandlers();
  for (int i = 0; i < rt->options_.workers; ++i) {
    rt->workers_.emplace_back([r = rt.get(), i] { r->WorkerMain(i); });
  }
  return rt;
}

OffloadRuntime::~OffloadRuntime() {
  std::deque<Task> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    left.swap(queue_);
  }
  cv_.notify_all();
  for (Task& t : left) t.done(Cancelled("the memserver is shutting down"));
  for (auto& w : workers_) w.join();
  for (void* h : handles_) dlclose(h);
}

Status OffloadRuntime::LoadLibrary(const std::string& path) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* err = dlerror();
    return InvalidArgument("--offload_lib ", path, ": ", err != nullptr ? err : "dlopen failed");
  }
  handles_.push_back(h);
  auto list = reinterpret_cast<tessera_offload_functions_fn>(dlsym(h, "tessera_offload_functions"));
  if (list == nullptr) {
    return InvalidArgument("--offload_lib ", path,
                           ": does not export tessera_offload_functions (see "
                           "apps/kayak/server/tessera_offload.h)");
  }
  uint32_t n = 0;
  const tessera_offload_function* fns = list(&n);
  if (fns == nullptr || n == 0) return InvalidArgument("--offload_lib ", path, ": no functions");
  for (uint32_t i = 0; i < n; ++i) {
    const auto& f = fns[i];
    if (f.id < TESSERA_OFFLOAD_FIRST_USER_ID) {
      return InvalidArgument("--offload_lib ", path, ": function id ", f.id, " is below ",
                             TESSERA_OFFLOAD_FIRST_USER_ID, " (reserved for built-ins)");
    }
    if (f.fn == nullptr) return InvalidArgument("--offload_lib ", path, ": function ", f.id, " is NULL");
    auto [it, inserted] = user_.emplace(
        f.id, UserFunction{f.name != nullptr ? f.name : "unnamed", path, f.fn});
    if (!inserted) {
      return InvalidArgument("--offload_lib ", path, ": function id ", f.id, " is also defined by ",
                             it->second.library);
    }
  }
  TLOG(INFO) << "offload: loaded " << n << " function(s) from " << path;
  return Status::Ok();
}

bool OffloadRuntime::HasFunction(uint32_t id) const {
  return bi::IsBuiltin(id) || user_.count(id) != 0;
}

std::string OffloadRuntime::FunctionList() const {
  std::ostringstream out;
  for (uint32_t id = 1; id <= bi::kMaxBuiltinId; ++id) out << id << " " << bi::Name(id) << "\n";
  for (auto& [id, f] : user_) out << id << " " << f.name << " (" << f.library << ")\n";
  return out.str();
}

Result<OffloadRuntime::SubmitOutcome> OffloadRuntime::Submit(uint32_t table, uint32_t function_id,
                                                            std::vector<uint8_t> args,
                                                            bool no_pushback, Done done) {
  if (table == 0) return InvalidArgument("table id must be non-zero");
  if (!HasFunction(function_id)) {
    return NotFound("no offload function ", function_id, " on this server");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Cancelled("the memserver is shutting down");
    const size_t bound = no_pushback ? options_.hard_queue : options_.max_queue;
    if (queue_.size() >= bound) {
      pushed_back_.fetch_add(1, std::memory_order_relaxed);
      if (no_pushback) {
        return ResourceExhausted("offload queue holds ", queue_.size(), " invocations (hard bound)");
      }
      return SubmitOutcome::kPushedBack;
    }
    queue_.push_back(Task{table, function_id, std::move(args), std::move(done)});
  }
  cv_.notify_one();
  return SubmitOutcome::kQueued;
}

uint64_t OffloadRuntime::EstimateNs(uint32_t id, std::span<const uint8_t> args) const {
  // A hop (hash lookup, copy and fold of a small value) costs well under this on any machine
  // this runs on; large values are caught by the inline deadline instead.
  constexpr double kHopNs = 300;
  if (id == bi::kMultiGetAggregate) {
    if (args.size() < 8) return 0;
    return static_cast<uint64_t>(kHopNs * std::min<uint64_t>(bi::LoadLe64(args.data()), bi::kMaxAggregateKeys));
  }
  if (!bi::IsBuiltin(id) || args.size() != bi::ChaseArgs::kSize) return 0;
  const uint64_t w = bi::LoadLe64(args.data() + 8);
  const double hops = static_cast<double>(std::min<uint32_t>(static_cast<uint32_t>(w), bi::kMaxHops));
  const double iters = static_cast<double>(static_cast<uint32_t>(w >> 32));
  return static_cast<uint64_t>(kHopNs * hops + compute_ns_per_iter_ * iters);
}

std::optional<Result<InvokeResult>> OffloadRuntime::TryInline(uint32_t table, uint32_t id,
                                                             std::span<const uint8_t> args) {
  if (options_.inline_ns == 0 || !bi::IsBuiltin(id)) return std::nullopt;
  if (table == 0) return Result<InvokeResult>(InvalidArgument("table id must be non-zero"));
  if (EstimateNs(id, args) > options_.inline_ns) return std::nullopt;
  const uint64_t cutoff_ns = options_.inline_ns * 4 + 20'000;
  InvokeResult out;
  for (uint32_t attempt = 1; attempt <= options_.max_attempts; ++attempt) {
    Txn txn(store_, table, RunBudget(cutoff_ns, RunBudget::Clock::kWall), bi::IsReadWrite(id));
    auto r = RunBuiltin(txn, id, args, cutoff_ns);
    if (!r.ok()) {
      if (r.status().code() == StatusCode::kTimeout) {
        // Over the inline deadline: nothing was written; the pool runs it with the full budget.
        inline_overran_.fetch_add(1, std::memory_order_relaxed);
        return std::nullopt;
      }
      failed_.fetch_add(1, std::memory_order_relaxed);
      return Result<InvokeResult>(r.status());
    }
    auto committed = txn.Commit();
    if (!committed.ok()) {
      failed_.fetch_add(1, std::memory_order_relaxed);
      return Result<InvokeResult>(committed.status());
    }
    if (*committed) {
      out.result = std::move(*r);
      out.attempts = attempt;
      completed_.fetch_add(1, std::memory_order_relaxed);
      inline_completed_.fetch_add(1, std::memory_order_relaxed);
      return Result<InvokeResult>(std::move(out));
    }
    conflicts_.fetch_add(1, std::memory_order_relaxed);
  }
  failed_.fetch_add(1, std::memory_order_relaxed);
  return Result<InvokeResult>(Unavailable("offload function ", id, " gave up after ",
                                          options_.max_attempts, " conflicting attempts"));
}

Result<InvokeResult> OffloadRuntime::RunBuiltinHere(uint32_t table, uint32_t function_id,
                                                    std::span<const uint8_t> args) {
  if (!bi::IsBuiltin(function_id)) return NotFound("no built-in function ", function_id);
  Task t{table, function_id, std::vector<uint8_t>(args.begin(), args.end()), nullptr};
  return Run(t);
}

void OffloadRuntime::WorkerMain(int index) {
  WorkerSignals signals;
  tls_signals = &signals;
  std::vector<uint8_t> user_out(user_.empty() ? 0 : kUserOutCap);
  tls_user_out = &user_out;
  // The stop signal must reach this thread (the memserver blocks others in every thread).
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, StopSignal());
  sigaddset(&set, SIGSEGV);
  sigaddset(&set, SIGBUS);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  std::vector<uint8_t> altstack;
  if (!user_.empty()) {
    altstack.resize(64 << 10);
    stack_t ss{};
    ss.ss_sp = altstack.data();
    ss.ss_size = altstack.size();
    sigaltstack(&ss, nullptr);
    sigevent sev{};
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = StopSignal();
    sev.sigev_notify_thread_id = static_cast<pid_t>(::syscall(SYS_gettid));
    // On this thread's CPU clock, as RunBudget: waiting for a CPU does not use the budget.
    signals.timer_ok = timer_create(CLOCK_THREAD_CPUTIME_ID, &sev, &signals.timer) == 0;
    if (!signals.timer_ok) {
      TLOG(WARNING) << "offload worker " << index << ": timer_create failed (" << strerror(errno)
                    << "): operators' functions that never yield cannot be stopped";
    }
  }
  while (true) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) break;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    Result<InvokeResult> r = Run(task);
    (r.ok() ? completed_ : failed_).fetch_add(1, std::memory_order_relaxed);
    task.done(std::move(r));
  }
  if (signals.timer_ok) timer_delete(signals.timer);
  if (!altstack.empty()) {
    stack_t ss{};
    ss.ss_flags = SS_DISABLE;
    sigaltstack(&ss, nullptr);
  }
  tls_signals = nullptr;
  tls_user_out = nullptr;
}

Result<InvokeResult> OffloadRuntime::Run(const Task& task) {
  InvokeResult out;
  for (uint32_t attempt = 1; attempt <= options_.max_attempts; ++attempt) {
    const bool builtin = bi::IsBuiltin(task.function_id);
    Txn txn(store_, task.table, RunBudget(options_.budget_ns, RunBudget::Clock::kThreadCpu),
            !builtin || bi::IsReadWrite(task.function_id));
    if (builtin) {
      auto r = RunBuiltin(txn, task.function_id, task.args, options_.budget_ns);
      if (!r.ok()) {
        if (r.status().code() == StatusCode::kTimeout) {
          stopped_budget_.fetch_add(1, std::memory_order_relaxed);
        }
        return r.status();
      }
      out.result = std::move(*r);
    } else {
      auto it = user_.find(task.function_id);
      if (it == user_.end()) return NotFound("no offload function ", task.function_id);
      if (tls_signals == nullptr) {
        return Internal("operators' functions run on offload workers only");
      }
      UserFrame f;
      f.call.txn = &txn;
      f.call.signals = tls_signals;
      RunUserOnce(it->second.fn, task.args, options_.budget_ns, &f);
      const std::string who = "offload function " + std::to_string(task.function_id) + " (" +
                              it->second.name + ")";
      switch (f.stop) {
        case kStopBudget:
          stopped_budget_.fetch_add(1, std::memory_order_relaxed);
          TLOG(WARNING) << who << " stopped: ran past its budget";
          return Timeout(who, " stopped: ran past its budget of ", options_.budget_ns / 1000,
                         " us of CPU time");
        case kStopFault:
          stopped_fault_.fetch_add(1, std::memory_order_relaxed);
          TLOG(WARNING) << who << " stopped: memory fault";
          return OutOfRange(who, " stopped: memory fault (it touched memory out of its range)");
        case kStopMisuse:
          stopped_fault_.fetch_add(1, std::memory_order_relaxed);
          TLOG(WARNING) << who << " stopped: " << f.call.misuse;
          return OutOfRange(who, " stopped: bad table handle call: ", f.call.misuse);
        default:
          break;
      }
      if (f.rc != TESSERA_OFFLOAD_OK) {
        return InvalidArgument(who, " failed with code ", f.rc);
      }
      if (f.out_len > kUserOutCap) {
        stopped_fault_.fetch_add(1, std::memory_order_relaxed);
        return OutOfRange(who, " stopped: out_len ", f.out_len, " exceeds out_cap ", kUserOutCap);
      }
      out.result.assign(tls_user_out->begin(), tls_user_out->begin() + f.out_len);
    }
    TESSERA_ASSIGN_OR_RETURN(bool committed, txn.Commit());
    if (committed) {
      out.attempts = attempt;
      return out;
    }
    conflicts_.fetch_add(1, std::memory_order_relaxed);
  }
  return Unavailable("offload function ", task.function_id, " gave up after ",
                     options_.max_attempts, " conflicting attempts");
}

OffloadRuntime::Stats OffloadRuntime::stats() const {
  Stats s;
  s.completed = completed_.load();
  s.failed = failed_.load();
  s.pushed_back = pushed_back_.load();
  s.stopped_budget = stopped_budget_.load();
  s.stopped_fault = stopped_fault_.load();
  s.conflicts = conflicts_.load();
  s.inline_completed = inline_completed_.load();
  s.inline_overran = inline_overran_.load();
  std::lock_guard<std::mutex> lock(mu_);
  s.queued = static_cast<uint32_t>(queue_.size());
  return s;
}

std::string OffloadRuntime::StatsText() const {
  Stats s = stats();
  std::ostringstream out;
  out << "offload_completed " << s.completed << "\n"
      << "offload_failed " << s.failed << "\n"
      << "offload_pushed_back " << s.pushed_back << "\n"
      << "offload_stopped_budget " << s.stopped_budget << "\n"
      << "offload_stopped_fault " << s.stopped_fault << "\n"
      << "offload_conflicts " << s.conflicts << "\n"
      << "offload_inline_completed " << s.inline_completed << "\n"
      << "offload_inline_overran " << s.inline_overran << "\n"
      << "offload_queued " << s.queued << "\n";
  return out.str();
}

}  // namespace tessera::kayak
