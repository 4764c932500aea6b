// OffloadRuntime: runs offload functions (KV_INVOKE) on a memserver's CPU next to its KV tables.
//
// Functions are the built-ins (apps/kayak/wire/builtins.h) and operators' functions loaded at
// start-up from shared libraries (the C ABI in apps/kayak/server/tessera_offload.h). They run on a
// bounded pool of worker threads, except cheap built-ins, which run inline on the caller's thread
// (the network I/O thread) to spare the request two thread hand-offs:
//   - Inline: TryInline() runs a built-in whose estimated cost (hops, keys and compute rounds,
//     the rounds timed at start-up) is within `inline_ns`, with a deadline of a few times that;
//     one that overruns it (large values) has written nothing and is handed to the pool instead.
//     Operators' functions always go to the pool: stopping one that misbehaves needs the
//     worker's timer signal and alternate stack.
//   - Server pushback: when more than `max_queue` invocations wait for a worker, Submit()
//     refuses at once (the server answers "pushed back" and the client runs the request the KV
//     way) instead of letting queueing delay grow (Splinter/ASFP-style adaptive placement).
//   - Transactions: a function reads through a transaction (recording the versions it saw) and
//     its writes are buffered; at the end a function that wrote commits with KvTable::Commit
//     (optimistic concurrency), and a conflict reruns it (up to `max_attempts`).
//   - Budget: each run on a worker gets `budget_ns` of that worker thread's CPU time, not wall
//     time: on a loaded machine a worker waits for a CPU, and a function must not be stopped
//     (or its fault reported as an overrun) for time it was not running. (A function that
//     blocks, which the ABI forbids, uses no CPU time and is not stopped.) Built-ins check it
//     at every hop and every 4096 compute rounds. Operators' functions are stopped by a
//     per-worker POSIX timer on the thread's CPU clock whose signal makes the worker jump out
//     of the function (deferred while the function is inside a runtime call, which then stops
//     it on return); a bad handle call or a memory fault in the function stops it the same
//     way. A stopped function writes nothing and its caller gets an error saying why; the
//     worker goes on with the next invocation.
//
// Ownership: borrows the KvStore (must outlive the runtime); owns the workers and the loaded
// libraries (dlclose'd at destruction). The destructor finishes queued invocations with
// Cancelled and joins the workers.
// Threads: Submit() and stats() from any thread; `done` callbacks run on worker threads (or on
// the caller's thread for errors found before queueing) and must not block for long.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "apps/kayak/server/kv_table.h"
#include "apps/kayak/server/tessera_offload.h"

namespace tessera::kayak {

struct OffloadOptions {
  // Worker threads, 1..64, and the CPU time one run may take on a worker: in a memserver, the
  // CPU it lends the service (memserver/service.h CpuLoan) replaces both.
  int workers = 2;
  uint32_t max_queue = 32;           // Waiting invocations beyond which Submit() pushes back.
  uint32_t hard_queue = 4096;        // Even kNoPushback invocations are refused beyond this.
  uint64_t budget_ns = 50'000'000;
  // Built-ins estimated to take at most this run inline on the I/O thread (0: never); an
  // inline run is cut off (and queued instead) after inline_ns * 4 + 20 us.
  uint64_t inline_ns = 10'000;
  uint32_t max_attempts = 16;        // Runs of a read-write function before giving up on conflicts.
  std::vector<std::string> libraries;  // --offload_lib paths, loaded by Create().
};

struct InvokeResult {
  std::vector<uint8_t> result;
  uint32_t attempts = 1;
};

class OffloadRuntime {
 public:
  using Done = std::function<void(Result<InvokeResult>)>;
  enum class SubmitOutcome { kQueued, kPushedBack };

  struct Stats {
    uint64_t completed = 0;
    uint64_t failed = 0;
    uint64_t pushed_back = 0;
    uint64_t stopped_budget = 0;
    uint64_t stopped_fault = 0;
    uint64_t conflicts = 0;  // Reruns after a failed commit.
    uint64_t inline_completed = 0;  // Of `completed`, run inline on an I/O thread.
    uint64_t inline_overran = 0;    // Inline runs cut off and queued instead.
    uint32_t queued = 0;
  };

  // Loads the libraries (errors name the file and the problem: dlopen failure, missing
  // tessera_offload_functions, bad or duplicate ids) and starts the workers.
  static Result<std::unique_ptr<OffloadRuntime>> Create(KvStore* store, OffloadOptions options);
  ~OffloadRuntime();
  OffloadRuntime(const OffloadRuntime&) = delete;
  OffloadRuntime& operator=(const OffloadRuntime&) = delete;

  // Queues one invocation; `done` is called exactly once when kQueued is returned (and never
  // otherwise). NotFound for an unknown function, InvalidArgument for table 0.
  Result<SubmitOutcome> Submit(uint32_t table, uint32_t function_id, std::vector<uint8_t> args,
                               bool no_pushback, Done done);
  // Runs a cheap built-in here (see above): nullopt when it is not cheap or overran its inline
  // deadline (nothing written): then Submit() it. Errors (bad arguments, a broken chain) are
  // answers like any other. Same argument checks as Submit().
  std::optional<Result<InvokeResult>> TryInline(uint32_t table, uint32_t function_id,
                                                std::span<const uint8_t> args);
  // Estimated nanoseconds of a built-in call with these arguments (0 for malformed ones).
  uint64_t EstimateNs(uint32_t function_id, std::span<const uint8_t> args) const;
  // Runs one invocation on the calling thread (tests, and the CLI-free in-process path). The
  // budget applies to built-ins only when called here (operators' functions need a worker).
  Result<InvokeResult> RunBuiltinHere(uint32_t table, uint32_t function_id,
                                      std::span<const uint8_t> args);

  bool HasFunction(uint32_t function_id) const;
  // "id name" lines of every function.
  std::string FunctionList() const;
  Stats stats() const;
  std::string StatsText() const;

 private:
  struct Task {
    uint32_t table;
    uint32_t function_id;
    std::vector<uint8_t> args;
    Done done;
  };
  struct UserFunction {
    std::string name;
    std::string library;
    tessera_offload_fn fn;
  };

  OffloadRuntime(KvStore* store, OffloadOptions options);
  Status LoadLibrary(const std::string& path);
  void WorkerMain(int index);
  Result<InvokeResult> Run(const Task& task);

  KvStore* const store_;
  const OffloadOptions options_;
  std::vector<void*> handles_;
  std::map<uint32_t, UserFunction> user_;  // Immutable after Create().

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;  // Under mu_.
  bool stopping_ = false;   // Under mu_.
  std::vector<std::thread> workers_;

  std::atomic<uint64_t> completed_{0}, failed_{0}, pushed_back_{0}, stopped_budget_{0},
      stopped_fault_{0}, conflicts_{0}, inline_completed_{0}, inline_overran_{0};
  double compute_ns_per_iter_ = 1.0;  // Timed by Create().
};

}  // namespace tessera::kayak
