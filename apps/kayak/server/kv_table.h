// KV tables hosted in a memserver's slabs (the KV half of Kayak; see apps/kayak/wire/wire.h).
//
// KvArena keeps object records in slabs of the server's SlabPool, owned by the owner id the
// memserver reserved for the service (memserver/service.h ServiceHost::slab_owner(): no client
// may authenticate as it, and the resource monitor never evicts its slabs). Records are carved from per-size-class slabs
// (64 B .. 128 KiB, powers of two, memcached style) and recycled through per-class free lists.
// When the pool refuses a new slab the arena is full: a write then fails with
// ResourceExhausted and nothing stored changes.
//
// KvTable is one table: a hash index split into `shards` (each a mutex and an open-addressing,
// linear-probing array of {hash, record} that doubles at 70% load and deletes by backward
// shift, so there are no tombstones) over records in the arena. A record is
// [u64 version][u16 key_len][u16 0][u32 value_len][key][value]. Every write takes a fresh
// version from a per-table counter, so versions of a key only grow; version 0 means absent.
// The index arrays live in ordinary heap memory (they must grow past a slab); the keys and
// values, the bulk of the data, live in the slabs.
//
// Commit() is the optimistic-concurrency check of a read-write transaction that ran elsewhere
// (on a client, or a function on this server): it locks every shard the transaction touches
// (in shard order, so concurrent commits cannot deadlock), checks that each key read still has
// the version that was read, and applies every write with one new version, all or nothing.
//
// Ownership: KvStore owns its tables and the arena; the arena borrows the SlabPool, which must
// outlive it. Threads: every method may be called from any thread concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

#include "apps/kayak/wire/key_hash.h"
#include "apps/kayak/wire/wire.h"
#include "common/status.h"
#include "memserver/slab_pool.h"

namespace tessera::kayak {

using memserver::OwnerId;
using memserver::SlabPool;
using wire::KvKeyHash;

inline constexpr uint32_t kKvMaxKeyLength = wire::kMaxKeyLength;
inline constexpr uint32_t kKvMaxValueLength = wire::kMaxValueLength;

class KvArena {
 public:
  // Slabs are allocated from `pool` as `owner` (the owner id reserved for the service).
  KvArena(SlabPool* pool, OwnerId owner);
  ~KvArena();
  KvArena(const KvArena&) = delete;
  KvArena& operator=(const KvArena&) = delete;

  // A record of `bytes` bytes; returns its reference (never 0). ResourceExhausted when the pool
  // has no slab left for its size class; InvalidArgument when it cannot fit in a slab.
  Result<uint64_t> Allocate(size_t bytes);
  void Free(uint64_t ref, size_t bytes);
  uint8_t* At(uint64_t ref) const;
  // Chunk size of the class `bytes` falls in.
  static size_t ClassSize(size_t bytes);

  struct Stats {
    uint64_t slabs = 0;
    uint64_t bytes_in_use = 0;  // Chunk bytes handed out and not freed.
  };
  Stats stats() const;

 private:
  static constexpr int kClasses = 12;  // 64 B .. 128 KiB.
  struct Class {
    std::vector<uint64_t> free;
    uint32_t slab = 0;  // 1-based index of the slab being carved (0: none).
    uint64_t next = 0, end = 0;
  };
  SlabPool* const pool_;
  const OwnerId owner_;
  const uint64_t max_slabs_;
  // Slab bases by 1-based index; entries are written once under mu_ before any reference to
  // them is published, and read lock-free after.
  std::unique_ptr<std::atomic<uint8_t*>[]> bases_;
  mutable std::mutex mu_;
  std::vector<uint64_t> slab_ids_;  // Under mu_.
  Class classes_[kClasses];         // Under mu_.
  uint64_t in_use_ = 0;             // Under mu_.
};

class KvTable {
 public:
  struct Options {
    uint32_t shards = 16;           // Power of two, 1..1024.
    uint32_t initial_buckets = 64;  // Per shard; power of two >= 8.
  };
  struct WriteResult {
    bool conflict = false;  // A version did not match; nothing was written.
    uint64_t version = 0;   // Written version (0 for a delete); on conflict, the current one.
  };
  struct ReadItem {
    std::span<const uint8_t> key;
    uint64_t version = 0;  // The version that was read (0: absent).
  };
  struct WriteItem {
    std::span<const uint8_t> key;
    std::span<const uint8_t> value;
    bool is_delete = false;
  };
  struct Stats {
    uint64_t objects = 0;
    uint64_t buckets = 0;
    uint64_t key_value_bytes = 0;
  };

  KvTable(uint32_t id, KvArena* arena, Options options);
  ~KvTable();
  KvTable(const KvTable&) = delete;
  KvTable& operator=(const KvTable&) = delete;

  uint32_t id() const { return id_; }

  // Copies the value into *out (when non-null) and returns its version; 0 when absent.
  uint64_t Get(std::span<const uint8_t> key, std::vector<uint8_t>* out) const;
  // expect_version: 0 any, ~0 must be absent, else exact. InvalidArgument for a bad key/value
  // size, ResourceExhausted when the arena is full.
  Result<WriteResult> Put(std::span<const uint8_t> key, std::span<const uint8_t> value,
                          uint64_t expect_version);
  // NotFound when absent (and expect_version is 0).
  Result<WriteResult> Delete(std::span<const uint8_t> key, uint64_t expect_version);
  // All or nothing; see the file comment. A write of a key also read is checked against the
  // read version. `writes` must not name a key twice.
  Result<WriteResult> Commit(std::span<const ReadItem> reads, std::span<const WriteItem> writes);

  Stats stats() const;

 private:
  struct Entry {
    uint64_t hash = 0;
    uint64_t ref = 0;  // 0: empty.
  };
  struct Shard {
    mutable std::mutex mu;
    std::vector<Entry> slots;
    uint64_t count = 0;
    uint64_t bytes = 0;
  };
  static constexpr uint64_t kNotFoundSlot = ~uint64_t{0};

  Shard& ShardOf(uint64_t hash) const { return shards_[(hash >> 40) & (shards_.size() - 1)]; }
  size_t ShardIndex(uint64_t hash) const { return (hash >> 40) & (shards_.size() - 1); }
  // Slot of `key` in `s` (kNotFoundSlot when absent). Caller holds s.mu.
  uint64_t Find(const Shard& s, uint64_t hash, std::span<const uint8_t> key) const;
  uint64_t VersionAt(const Shard& s, uint64_t slot) const;
  // Inserts or replaces with a pre-allocated record. Caller holds s.mu.
  void Install(Shard& s, uint64_t hash, uint64_t slot, uint64_t ref, size_t record_bytes);
  void Erase(Shard& s, uint64_t slot);
  void Grow(Shard& s);
  Result<uint64_t> NewRecord(std::span<const uint8_t> key, std::span<const uint8_t> value,
                             uint64_t version);
  size_t RecordBytes(uint64_t ref) const;

  const uint32_t id_;
  KvArena* const arena_;
  mutable std::vector<Shard> shards_;
  std::atomic<uint64_t> next_version_{1};
};

// Every table of one server, created on first write.
class KvStore {
 public:
  KvStore(SlabPool* pool, OwnerId owner, KvTable::Options table_options = {});
  // The table, or nullptr when it does not exist and `create` is false.
  KvTable* Table(uint32_t id, bool create);
  std::string StatsText();
  KvArena& arena() { return arena_; }

 private:
  KvArena arena_;
  const KvTable::Options table_options_;
  std::shared_mutex mu_;
  std::map<uint32_t, std::unique_ptr<KvTable>> tables_;  // Under mu_.
};

}  // namespace tessera::kayak
