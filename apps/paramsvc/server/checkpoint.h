// Checkpoints of the Parameter Service into Tessera's erasure-coded page store, and the link
// between an aggregation server and its supervisor.
//
// Why a supervisor: the remote page store keeps the CRC of every split in its client's memory
// (client/remote_store.h), so pages can only be read back by the process that wrote them. So
// `tessera paramsvc serve` is two processes: a small supervisor that owns the listening socket
// and the erasure-coded store (CreateErasureCodedStore over the memservers), and the aggregation
// server it forks (the cores, the jobs, all model state). The aggregation server streams each
// partition's latest state to the supervisor (CheckpointLink, a socketpair); the supervisor
// writes it to the store asynchronously, latest version first, into one of two page slots per
// partition (so a torn write never overwrites the last good checkpoint), and only then points
// its index at it. When the aggregation server dies (SIGKILL, crash, OOM), the supervisor
// starts a replacement on the same listening socket and streams every job back from the store
// (read through the page store, SHA-256 checked); clients reconnect and resynchronise.
//
// Moves between servers (server.h): the supervisor also keeps, in its index, which jobs are
// staged copies of a move arriving (restored staged, so they ask their source), the
// tombstones of jobs that moved away (restored instead of the job: the commit point of a move
// is the supervisor receiving that record) and the drain flag. Sync() is the aggregation
// server's way to know the supervisor holds everything it sent, and the store every write.
//
// Iterations lost: per partition, the updates applied after its last completed checkpoint
// write: the one being written plus those applied meanwhile, i.e. 1 + ceil(write time /
// iteration time) at most (1-2 when a write is faster than an iteration). Measured by the
// failure test and reported by the supervisor's log line "restored job ...".
// Limits: the supervisor is a single process per host; losing the whole host loses the index
// (the pages stay on the memservers until their orphan lease frees them).
//
// Threads: CheckpointLink is thread-safe (one mutex per direction). CheckpointKeeper runs a
// reader thread and a writer thread of its own; its public methods are for the supervisor's
// main thread.
#pragma once

#include <cstdint>
#include <array>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "apps/paramsvc/server/server.h"
#include "client/page_store.h"
#include "common/fd.h"
#include "common/status.h"

namespace tessera::paramsvc {

// The aggregation server's end: a CheckpointSink that sends to the supervisor, plus restore.
class CheckpointLink : public CheckpointSink {
 public:
  explicit CheckpointLink(UniqueFd fd) : fd_(std::move(fd)) {}
  void SaveJob(uint32_t job, const JobSpec& spec) override;
  void DropJob(uint32_t job) override;
  void SavePartition(uint32_t job, uint32_t partition, const PartitionState& state) override;
  void SaveStagedJob(uint32_t job, const JobSpec& spec, uint64_t move_id,
                     const std::string& source) override;
  void ActivateJob(uint32_t job) override;
  void SaveMoved(const MovedRecord& r) override;
  void SaveDrain(bool on, const std::string& redirect) override;
  Result<bool> Sync(uint32_t job) override;
  // Asks the supervisor for every checkpointed job (and tombstone, and the drain flag) and
  // restores them into `server`. Returns the number of jobs restored.
  Result<int> Restore(Server* server);
  uint64_t send_errors() const { return send_errors_; }

 private:
  void SendMsg(uint8_t type, std::span<const uint8_t> a, std::span<const uint8_t> b = {});
  UniqueFd fd_;
  std::mutex mu_;
  uint64_t send_errors_ = 0;
};

struct KeeperStats {
  uint64_t saves_received = 0;
  uint64_t saves_written = 0;
  uint64_t saves_superseded = 0;  // A newer version arrived before the older was written.
  uint64_t write_errors = 0;
  uint64_t pages_used = 0;
};

// The supervisor's end: owns the page store (not the aggregation server).
class CheckpointKeeper {
 public:
  explicit CheckpointKeeper(std::unique_ptr<client::PageStore> store);  // store may be null
  ~CheckpointKeeper();
  // Serves one aggregation server over `fd` (restore requests, then saves) until it hangs up.
  // Blocks; call from the supervisor's thread. Returns when the peer closes.
  void Serve(int fd);
  // Waits until every received save is written (tests, shutdown).
  void Drain();
  KeeperStats stats();
  // The durable version of each partition of `job` (tests).
  std::vector<uint64_t> DurableVersions(uint32_t job);

 private:
  struct Slot {
    uint64_t first_page = 0;
    uint64_t pages = 0;
  };
  struct PartEntry {
    Slot slots[2];
    int current = -1;  // Slot holding the durable checkpoint
    uint64_t version = 0;
    uint64_t length = 0;
    std::array<uint8_t, 32> digest{};
    bool pending = false;
    std::vector<uint8_t> pending_bytes;
    uint64_t pending_version = 0;
  };
  struct JobEntry {
    JobSpec spec;
    std::vector<PartEntry> parts;
    std::vector<uint64_t> received;  // Per partition: the last version received (Sync)
    std::vector<uint8_t> has;        // Per partition: a state was received
    uint64_t staged_move = 0;        // A staged copy of this move (0: the job itself)
    std::string staged_from;
  };
  void WriterLoop();
  Status Allocate(PartEntry* e, uint64_t bytes);
  Status SendRestore(int fd);
  // Whether every partition of `job` is durable at the version last received (mu_ held).
  bool Durable(uint32_t job);
  void TrimJob(JobEntry& j);  // mu_ held

  std::unique_ptr<client::PageStore> store_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint32_t, JobEntry> jobs_;
  std::map<uint32_t, MovedRecord> moved_;
  bool drain_ = false;
  std::string drain_to_;
  uint64_t next_page_ = 0;
  bool stop_ = false;
  int writing_ = 0;
  KeeperStats stats_;
  std::thread writer_;
};

}  // namespace tessera::paramsvc
