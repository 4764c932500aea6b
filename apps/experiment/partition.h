// Partition: cuts loopback TCP traffic to and from chosen ports with nftables, for the
// experiment runner's partition/heal faults.
//
// All rules live in one nftables table named `tessera_exp_<pid>` (inet family, an output-hook
// chain dropping `tcp dport P` and `tcp sport P`), created on the first Cut() and deleted when
// the last port is healed and by the destructor, so a scenario that fails or is cancelled never
// leaves rules behind. While the table exists (from Prepare() on, when it is used) the object
// holds an exclusive flock on the lock file given at construction, when one is given (other
// tools that change the network or swap can wait for it). Tables of runners that died without cleaning up
// (their pid is gone) are removed by Available().
//
// Threads: one owner thread; not thread-safe.
#pragma once

#include <set>
#include <string>

#include "common/fd.h"
#include "common/status.h"

namespace tessera::experiment {

class Partition {
 public:
  explicit Partition(std::string lock_path);
  ~Partition();
  Partition(const Partition&) = delete;
  Partition& operator=(const Partition&) = delete;

  // OK when nftables can be used here (the `nft` tool exists and may add a table); the reason
  // otherwise. Cached after the first call.
  Status Available();
  // Checks Available() and takes the lock now (waiting up to wait_ms for other holders), so
  // that later Cut()s do not wait. The lock is then held until the object is destroyed.
  Status Prepare(int wait_ms);
  // Drops loopback TCP traffic to and from `port` from now on.
  Status Cut(int port);
  // Lets it through again; removes the table (and releases the lock) with the last port.
  Status Heal(int port);
  // Removes every rule now.
  void HealAll();

  const std::string& table() const { return table_; }
  static bool TableExists(const std::string& table);

 private:
  Status Lock(int wait_ms);
  Status Rebuild();

  std::string lock_path_;
  std::string table_;
  UniqueFd lock_fd_;
  std::set<int> ports_;
  bool table_exists_ = false;
  int available_ = -1;      // -1 unknown, 0 no, 1 yes.
  bool keep_lock_ = false;  // Prepare()d: hold the lock to the end.
  std::string unavailable_reason_;
};

}  // namespace tessera::experiment
