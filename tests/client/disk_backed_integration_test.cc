// DiskBackedStore over the real single-copy remote store (3 memserver processes on loopback) and
// a real LocalSsdStore: SIGKILL the server holding some pages; every page still reads back right
// (from the disk copy), and writes to pages whose server is gone go through to disk.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "client/disk_backed_store.h"
#include "client/local_cluster.h"
#include "client/local_ssd_store.h"
#include "client/remote_store.h"
#include "tests/support/test_util.h"

namespace tessera::client {
namespace {

std::vector<uint8_t> Pattern(uint64_t page, uint64_t version) {
  std::vector<uint8_t> v(kPageSize);
  std::mt19937_64 rng(page * 1000003 + version);
  for (size_t i = 0; i < kPageSize; i += 8) {
    uint64_t x = rng();
    std::memcpy(v.data() + i, &x, 8);
  }
  return v;
}

TEST(DiskBackedIntegrationTest, KilledServerPagesComeBackFromDiskAndWritesGoThrough) {
  LocalClusterOptions co;
  co.bin_dir = testing::BinDir();
  co.servers = 3;
  co.capacity = "16M";
  co.slab_size = "64K";  // 16 pages per slab: the pages spread over all three servers.
  auto cluster = LocalCluster::Start(co);
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  constexpr uint64_t kPages = 192;
  ReplicatedStoreOptions ro;
  for (const auto& e : (*cluster)->endpoints()) ro.remote.servers.push_back({e, ""});
  ro.remote.secret = (*cluster)->secret();
  ro.remote.capacity_pages = kPages;
  ro.remote.op_timeout_ms = 1000;
  ro.copies = 1;
  auto single = CreateReplicatedStore(ro);
  ASSERT_TRUE(single.ok()) << single.status();
  PageStore* primary = single->get();

  testing::TempDir dir;
  LocalSsdOptions so;
  so.path = dir.path() + "/backup.pages";
  so.capacity_pages = kPages;
  auto ssd = LocalSsdStore::Create(so);
  ASSERT_TRUE(ssd.ok()) << ssd.status();
  auto made = DiskBackedStore::Create(std::move(single).value(), std::move(ssd).value());
  ASSERT_TRUE(made.ok()) << made.status();
  DiskBackedStore& store = **made;

  std::vector<PageId> ids(kPages);
  std::vector<uint8_t> all(kPages * kPageSize);
  for (PageId p = 0; p < kPages; ++p) {
    ids[p] = p;
    std::memcpy(all.data() + p * kPageSize, Pattern(p, 1).data(), kPageSize);
  }
  ASSERT_TRUE(store.WritePages(ids.data(), kPages, all.data()).ok());
  ASSERT_TRUE(store.Flush().ok());

  // The server of page 0 dies; remember which pages it held.
  auto victim = ServersOfPage(*primary, 0);
  ASSERT_TRUE(victim.ok()) << victim.status();
  const size_t dead = (*victim)[0];
  std::set<PageId> on_dead;
  for (PageId p = 0; p < kPages; ++p) {
    auto s = ServersOfPage(*primary, p);
    ASSERT_TRUE(s.ok()) << s.status();
    if ((*s)[0] == dead) on_dead.insert(p);
  }
  ASSERT_FALSE(on_dead.empty());
  ASSERT_LT(on_dead.size(), kPages) << "all pages on one server: the test proves less";
  ASSERT_TRUE((*cluster)->Kill(dead).ok());

  std::vector<uint8_t> out(kPageSize);
  for (PageId p = 0; p < kPages; ++p) {
    Status st = store.ReadPage(p, out.data());
    ASSERT_TRUE(st.ok()) << "page " << p << ": " << st;
    ASSERT_EQ(out, Pattern(p, 1)) << "page " << p;
  }
  EXPECT_GE(store.fallback_reads(), on_dead.size());

  // Rewrite every page: those of the dead server go through to disk (or are re-placed by the
  // primary); either way every page reads back its newest content.
  for (PageId p = 0; p < kPages; ++p) {
    Status st = store.WritePage(p, Pattern(p, 2).data());
    ASSERT_TRUE(st.ok()) << "page " << p << ": " << st;
  }
  for (PageId p = 0; p < kPages; ++p) {
    ASSERT_TRUE(store.ReadPage(p, out.data()).ok()) << "page " << p;
    ASSERT_EQ(out, Pattern(p, 2)) << "page " << p;
  }
  ASSERT_TRUE(store.Flush().ok());
  PageStoreStats s = store.Stats();
  EXPECT_EQ(s.read_errors, 0u);
  EXPECT_EQ(s.write_errors, 0u);
  EXPECT_GE(s.degraded_reads, on_dead.size());
}

}  // namespace
}  // namespace tessera::client
