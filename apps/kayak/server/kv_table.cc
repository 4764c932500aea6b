#include "apps/kayak/server/kv_table.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "common/logging.h"

namespace tessera::kayak {
namespace {

constexpr size_t kRecordHeader = 16;

uint64_t LoadU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

}  // namespace

// ---- KvArena ----

KvArena::KvArena(SlabPool* pool, OwnerId owner)
    : pool_(pool),
      owner_(owner),
      max_slabs_(pool->counts().max_slabs),
      bases_(new std::atomic<uint8_t*>[pool->counts().max_slabs + 1]) {
  for (uint64_t i = 0; i <= max_slabs_; ++i) bases_[i].store(nullptr, std::memory_order_relaxed);
}

KvArena::~KvArena() {
  std::lock_guard<std::mutex> lock(mu_);
  for (uint64_t id : slab_ids_) (void)pool_->Free(owner_, id);
}

size_t KvArena::ClassSize(size_t bytes) {
  size_t c = 64;
  while (c < bytes) c <<= 1;
  return c;
}

Result<uint64_t> KvArena::Allocate(size_t bytes) {
  const size_t size = ClassSize(bytes);
  int ci = 0;
  while ((size_t{64} << ci) < size) ++ci;
  if (ci >= kClasses || size > pool_->slab_bytes()) {
    return InvalidArgument("a KV record of ", bytes, " bytes does not fit in a ",
                           pool_->slab_bytes(), "-byte slab");
  }
  std::lock_guard<std::mutex> lock(mu_);
  Class& c = classes_[ci];
  uint64_t ref;
  if (!c.free.empty()) {
    ref = c.free.back();
    c.free.pop_back();
  } else {
    if (c.slab == 0 || c.next + size > c.end) {
      auto id = pool_->Alloc(owner_);
      if (!id.ok()) {
        return ResourceExhausted("KV store full: ", slab_ids_.size(),
                                 " slabs hold the tables and the pool has no free slab (",
                                 id.status().message(), ")");
      }
      auto mem = pool_->Resolve(owner_, *id, 0, pool_->slab_bytes());
      TCHECK(mem.ok()) << "a fresh KV slab does not resolve: " << mem.status().ToString();
      slab_ids_.push_back(*id);
      const uint32_t index = static_cast<uint32_t>(slab_ids_.size());
      TCHECK(index <= max_slabs_) << "more KV slabs than the pool has";
      bases_[index].store(mem->data(), std::memory_order_release);
      c.slab = index;
      c.next = 0;
      c.end = pool_->slab_bytes();
    }
    ref = (uint64_t{c.slab} << 32) | c.next;
    c.next += size;
  }
  in_use_ += size;
  return ref;
}

void KvArena::Free(uint64_t ref, size_t bytes) {
  const size_t size = ClassSize(bytes);
  int ci = 0;
  while ((size_t{64} << ci) < size) ++ci;
  std::lock_guard<std::mutex> lock(mu_);
  classes_[ci].free.push_back(ref);
  in_use_ -= size;
}

uint8_t* KvArena::At(uint64_t ref) const {
  return bases_[ref >> 32].load(std::memory_order_acquire) + (ref & 0xffffffffu);
}

KvArena::Stats KvArena::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {slab_ids_.size(), in_use_};
}

// ---- KvTable ----

KvTable::KvTable(uint32_t id, KvArena* arena, Options options)
    : id_(id), arena_(arena), shards_(options.shards) {
  TCHECK(options.shards >= 1 && options.shards <= 1024 &&
         (options.shards & (options.shards - 1)) == 0)
      << "KvTable shards must be a power of two in 1..1024";
  TCHECK(options.initial_buckets >= 8 &&
         (options.initial_buckets & (options.initial_buckets - 1)) == 0)
      << "KvTable initial_buckets must be a power of two >= 8";
  for (Shard& s : shards_) s.slots.resize(options.initial_buckets);
}

KvTable::~KvTable() {
  for (Shard& s : shards_) {
    for (const Entry& e : s.slots) {
      if (e.ref != 0) arena_->Free(e.ref, RecordBytes(e.ref));
    }
  }
}

size_t KvTable::RecordBytes(uint64_t ref) const {
  const uint8_t* r = arena_->At(ref);
  uint16_t klen;
  uint32_t vlen;
  std::memcpy(&klen, r + 8, 2);
  std::memcpy(&vlen, r + 12, 4);
  return kRecordHeader + klen + vlen;
}

uint64_t KvTable::Find(const Shard& s, uint64_t hash, std::span<const uint8_t> key) const {
  const uint64_t mask = s.slots.size() - 1;
  for (uint64_t i = hash & mask;; i = (i + 1) & mask) {
    const Entry& e = s.slots[i];
    if (e.ref == 0) return kNotFoundSlot;
    if (e.hash != hash) continue;
    const uint8_t* r = arena_->At(e.ref);
    uint16_t klen;
    std::memcpy(&klen, r + 8, 2);
    if (klen == key.size() && std::memcmp(r + kRecordHeader, key.data(), klen) == 0) return i;
  }
}

uint64_t KvTable::VersionAt(const Shard& s, uint64_t slot) const {
  if (slot == kNotFoundSlot) return 0;
  return LoadU64(arena_->At(s.slots[slot].ref));
}

uint64_t KvTable::Get(std::span<const uint8_t> key, std::vector<uint8_t>* out) const {
  if (key.empty() || key.size() > kKvMaxKeyLength) return 0;
  const uint64_t h = KvKeyHash(key, id_);
  Shard& s = ShardOf(h);
  std::lock_guard<std::mutex> lock(s.mu);
  uint64_t slot = Find(s, h, key);
  if (slot == kNotFoundSlot) return 0;
  const uint8_t* r = arena_->At(s.slots[slot].ref);
  uint32_t vlen;
  std::memcpy(&vlen, r + 12, 4);
  if (out != nullptr) out->assign(r + kRecordHeader + key.size(), r + kRecordHeader + key.size() + vlen);
  return LoadU64(r);
}

Result<uint64_t> KvTable::NewRecord(std::span<const uint8_t> key, std::span<const uint8_t> value,
                                    uint64_t version) {
  const size_t bytes = kRecordHeader + key.size() + value.size();
  TESSERA_ASSIGN_OR_RETURN(uint64_t ref, arena_->Allocate(bytes));
  uint8_t* r = arena_->At(ref);
  const uint16_t klen = static_cast<uint16_t>(key.size());
  const uint16_t zero = 0;
  const uint32_t vlen = static_cast<uint32_t>(value.size());
  std::memcpy(r, &version, 8);
  std::memcpy(r + 8, &klen, 2);
  std::memcpy(r + 10, &zero, 2);
  std::memcpy(r + 12, &vlen, 4);
  std::memcpy(r + kRecordHeader, key.data(), key.size());
  if (!value.empty()) std::memcpy(r + kRecordHeader + key.size(), value.data(), value.size());
  return ref;
}

void KvTable::Grow(Shard& s) {
  std::vector<Entry> old(s.slots.size() * 2);
  old.swap(s.slots);
  const uint64_t mask = s.slots.size() - 1;
  for (const Entry& e : old) {
    if (e.ref == 0) continue;
    uint64_t i = e.hash & mask;
    while (s.slots[i].ref != 0) i = (i + 1) & mask;
    s.slots[i] = e;
  }
}

void KvTable::Install(Shard& s, uint64_t hash, uint64_t slot, uint64_t ref, size_t record_bytes) {
  if (slot != kNotFoundSlot) {
    Entry& e = s.slots[slot];
    const size_t old_bytes = RecordBytes(e.ref);
    arena_->Free(e.ref, old_bytes);
    s.bytes -= old_bytes - kRecordHeader;
    e.ref = ref;
    s.bytes += record_bytes - kRecordHeader;
    return;
  }
  if ((s.count + 1) * 10 > s.slots.size() * 7) Grow(s);
  const uint64_t mask = s.slots.size() - 1;
  uint64_t i = hash & mask;
  while (s.slots[i].ref != 0) i = (i + 1) & mask;
  s.slots[i] = Entry{hash, ref};
  ++s.count;
  s.bytes += record_bytes - kRecordHeader;
}

void KvTable::Erase(Shard& s, uint64_t slot) {
  const size_t bytes = RecordBytes(s.slots[slot].ref);
  arena_->Free(s.slots[slot].ref, bytes);
  s.bytes -= bytes - kRecordHeader;
  --s.count;
  // Backward-shift deletion: pull later members of the probe run into the hole.
  const uint64_t mask = s.slots.size() - 1;
  uint64_t hole = slot;
  for (uint64_t i = (slot + 1) & mask; s.slots[i].ref != 0; i = (i + 1) & mask) {
    const uint64_t home = s.slots[i].hash & mask;
    // Movable when its home is not inside (hole, i] cyclically.
    const bool in_range = hole <= i ? (home > hole && home <= i) : (home > hole || home <= i);
    if (!in_range) {
      s.slots[hole] = s.slots[i];
      hole = i;
    }
  }
  s.slots[hole] = Entry{};
}

namespace {
Status CheckKey(std::span<const uint8_t> key) {
  if (key.empty() || key.size() > kKvMaxKeyLength) {
    return InvalidArgument("key length ", key.size(), " outside 1..", kKvMaxKeyLength);
  }
  return Status::Ok();
}
Status CheckValue(std::span<const uint8_t> value) {
  if (value.size() > kKvMaxValueLength) {
    return InvalidArgument("value length ", value.size(), " exceeds ", kKvMaxValueLength);
  }
  return Status::Ok();
}
constexpr uint64_t kAbsentOnly = ~uint64_t{0};
}  // namespace

Result<KvTable::WriteResult> KvTable::Put(std::span<const uint8_t> key,
                                          std::span<const uint8_t> value,
                                          uint64_t expect_version) {
  TESSERA_RETURN_IF_ERROR(CheckKey(key));
  TESSERA_RETURN_IF_ERROR(CheckValue(value));
  const uint64_t h = KvKeyHash(key, id_);
  Shard& s = ShardOf(h);
  std::lock_guard<std::mutex> lock(s.mu);
  const uint64_t slot = Find(s, h, key);
  const uint64_t current = VersionAt(s, slot);
  if ((expect_version == kAbsentOnly && current != 0) ||
      (expect_version != 0 && expect_version != kAbsentOnly && expect_version != current)) {
    return WriteResult{true, current};
  }
  const uint64_t version = next_version_.fetch_add(1);
  TESSERA_ASSIGN_OR_RETURN(uint64_t ref, NewRecord(key, value, version));
  Install(s, h, slot, ref, kRecordHeader + key.size() + value.size());
  return WriteResult{false, version};
}

Result<KvTable::WriteResult> KvTable::Delete(std::span<const uint8_t> key,
                                             uint64_t expect_version) {
  TESSERA_RETURN_IF_ERROR(CheckKey(key));
  const uint64_t h = KvKeyHash(key, id_);
  Shard& s = ShardOf(h);
  std::lock_guard<std::mutex> lock(s.mu);
  const uint64_t slot = Find(s, h, key);
  const uint64_t current = VersionAt(s, slot);
  if (expect_version != 0 && expect_version != current) return WriteResult{true, current};
  if (slot == kNotFoundSlot) return NotFound("no such key");
  Erase(s, slot);
  next_version_.fetch_add(1);
  return WriteResult{false, 0};
}

Result<KvTable::WriteResult> KvTable::Commit(std::span<const ReadItem> reads,
                                             std::span<const WriteItem> writes) {
  for (const ReadItem& r : reads) TESSERA_RETURN_IF_ERROR(CheckKey(r.key));
  for (const WriteItem& w : writes) {
    TESSERA_RETURN_IF_ERROR(CheckKey(w.key));
    TESSERA_RETURN_IF_ERROR(CheckValue(w.value));
  }
  std::vector<uint64_t> read_hash(reads.size()), write_hash(writes.size());
  std::vector<size_t> shard_ids;
  for (size_t i = 0; i < reads.size(); ++i) {
    read_hash[i] = KvKeyHash(reads[i].key, id_);
    shard_ids.push_back(ShardIndex(read_hash[i]));
  }
  for (size_t i = 0; i < writes.size(); ++i) {
    write_hash[i] = KvKeyHash(writes[i].key, id_);
    shard_ids.push_back(ShardIndex(write_hash[i]));
  }
  std::sort(shard_ids.begin(), shard_ids.end());
  shard_ids.erase(std::unique(shard_ids.begin(), shard_ids.end()), shard_ids.end());
  std::vector<std::unique_lock<std::mutex>> locks;
  locks.reserve(shard_ids.size());
  for (size_t id : shard_ids) locks.emplace_back(shards_[id].mu);

  for (size_t i = 0; i < reads.size(); ++i) {
    Shard& s = ShardOf(read_hash[i]);
    const uint64_t current = VersionAt(s, Find(s, read_hash[i], reads[i].key));
    if (current != reads[i].version) return WriteResult{true, current};
  }
  const uint64_t version = next_version_.fetch_add(1);
  // Allocate every new record first, so a full arena leaves the table untouched.
  std::vector<uint64_t> refs(writes.size(), 0);
  for (size_t i = 0; i < writes.size(); ++i) {
    if (writes[i].is_delete) continue;
    auto ref = NewRecord(writes[i].key, writes[i].value, version);
    if (!ref.ok()) {
      for (size_t j = 0; j < i; ++j) {
        if (refs[j] != 0) {
          arena_->Free(refs[j], kRecordHeader + writes[j].key.size() + writes[j].value.size());
        }
      }
      return ref.status();
    }
    refs[i] = *ref;
  }
  for (size_t i = 0; i < writes.size(); ++i) {
    Shard& s = ShardOf(write_hash[i]);
    const uint64_t slot = Find(s, write_hash[i], writes[i].key);
    if (writes[i].is_delete) {
      if (slot != kNotFoundSlot) Erase(s, slot);
    } else {
      Install(s, write_hash[i], slot, refs[i],
              kRecordHeader + writes[i].key.size() + writes[i].value.size());
    }
  }
  return WriteResult{false, version};
}

KvTable::Stats KvTable::stats() const {
  Stats st;
  for (Shard& s : shards_) {
    std::lock_guard<std::mutex> lock(s.mu);
    st.objects += s.count;
    st.buckets += s.slots.size();
    st.key_value_bytes += s.bytes;
  }
  return st;
}

// ---- KvStore ----

KvStore::KvStore(SlabPool* pool, OwnerId owner, KvTable::Options table_options)
    : arena_(pool, owner), table_options_(table_options) {}

KvTable* KvStore::Table(uint32_t id, bool create) {
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    auto it = tables_.find(id);
    if (it != tables_.end()) return it->second.get();
  }
  if (!create || id == 0) return nullptr;
  std::unique_lock<std::shared_mutex> lock(mu_);
  auto& t = tables_[id];
  if (!t) t = std::make_unique<KvTable>(id, &arena_, table_options_);
  return t.get();
}

std::string KvStore::StatsText() {
  std::ostringstream out;
  KvArena::Stats a = arena_.stats();
  uint64_t objects = 0;
  size_t tables = 0;
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    tables = tables_.size();
    for (auto& [id, t] : tables_) objects += t->stats().objects;
  }
  out << "kv_tables " << tables << "\n"
      << "kv_objects " << objects << "\n"
      << "kv_slabs " << a.slabs << "\n"
      << "kv_bytes_in_use " << a.bytes_in_use << "\n";
  return out.str();
}

}  // namespace tessera::kayak
