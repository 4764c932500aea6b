// The pager over the real erasure-coded store (RS(2,1) and RS(4,2) on LocalCluster memservers).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <random>
#include <thread>

#include "client/local_cluster.h"
#include "client/remote_store.h"
#include "common/clock.h"
#include "kernel_shim/pager/pager.h"
#include "tests/support/test_util.h"

namespace tessera::kernel_shim {
namespace {

constexpr size_t kPage = 4096;

uint8_t Pattern(size_t page, size_t off, uint32_t round) {
  return static_cast<uint8_t>((page * 151 + off * 13 + round * 71 + (off >> 8)) & 0xff);
}
void FillPage(uint8_t* p, size_t page, uint32_t round) {
  for (size_t off = 0; off < kPage; ++off) p[off] = Pattern(page, off, round);
}
size_t BadBytes(const uint8_t* p, size_t page, uint32_t round) {
  size_t bad = 0;
  for (size_t off = 0; off < kPage; ++off) bad += p[off] != Pattern(page, off, round);
  return bad;
}

struct Rig {
  std::unique_ptr<client::LocalCluster> cluster;
  std::unique_ptr<client::PageStore> store;
};

Rig StartRig(int k, int r, size_t pages) {
  Rig rig;
  client::LocalClusterOptions co;
  co.bin_dir = testing::BinDir();
  co.servers = static_cast<size_t>(k + r);
  co.capacity = "32M";
  co.slab_size = "1M";
  auto cluster = client::LocalCluster::Start(co);
  EXPECT_TRUE(cluster.ok()) << cluster.status().ToString();
  if (!cluster.ok()) return rig;
  rig.cluster = std::move(cluster).value();
  client::ErasureCodedStoreOptions eo;
  for (const auto& ep : rig.cluster->endpoints()) eo.remote.servers.push_back({ep, ""});
  eo.remote.secret = rig.cluster->secret();
  eo.remote.capacity_pages = pages;
  eo.k = k;
  eo.r = r;
  auto store = client::CreateErasureCodedStore(eo);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  if (store.ok()) rig.store = std::move(store).value();
  return rig;
}

std::unique_ptr<Pager> MakePager(client::PageStore* store, size_t pages, size_t limit_pages) {
  PagerOptions o;
  o.store = store;
  o.region_bytes = pages * kPage;
  o.local_limit_bytes = limit_pages * kPage;
  auto p = Pager::Create(o);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(p).value() : nullptr;
}

TEST(PagerIntegrationTest, WorkingSetTwiceTheLimitOverErasureCodedStore) {
  constexpr size_t kPages = 4096, kLimit = 2048;  // 16 MiB touched, 8 MiB local.
  Rig rig = StartRig(2, 1, kPages);
  ASSERT_TRUE(rig.store);
  auto pager = MakePager(rig.store.get(), kPages, kLimit);
  ASSERT_TRUE(pager);
  uint8_t* b = pager->base();
  for (size_t p = 0; p < kPages; ++p) FillPage(b + p * kPage, p, 1);
  std::mt19937 rng(3);
  std::vector<uint32_t> round(kPages, 1);
  for (int i = 0; i < 6000; ++i) {  // Random read-modify-write.
    size_t p = rng() % kPages;
    ASSERT_EQ(BadBytes(b + p * kPage, p, round[p]), 0u) << "page " << p;
    if (i % 3 == 0) FillPage(b + p * kPage, p, ++round[p]);
  }
  size_t bad = 0;
  for (size_t p = 0; p < kPages; ++p) bad += BadBytes(b + p * kPage, p, round[p]);
  EXPECT_EQ(bad, 0u);
  PagerStats s = pager->Stats();
  EXPECT_GT(s.evictions, kPages / 2);
  EXPECT_GT(s.remote_reads, 0u);
  EXPECT_GT(s.remote_writes, 0u);
  EXPECT_EQ(s.fill_errors, 0u);
  EXPECT_EQ(s.writeback_errors, 0u);
  EXPECT_LE(s.peak_resident_pages, kLimit + kLimit / 8 + 256);
}

// fork() over the erasure-coded store (pager.h, "fork"): the child reads the heap of the fork
// through the parent's pager while the parent rewrites and writes back its own; both stay near
// the limit. The store has twice the region's pages: the spares take the pages copied aside.
TEST(PagerIntegrationTest, ForkedChildSharesPagesThroughTheStore) {
  constexpr size_t kPages = 2048, kLimit = 256;
  Rig rig = StartRig(2, 1, 2 * kPages);
  ASSERT_TRUE(rig.store);
  auto pager = MakePager(rig.store.get(), kPages, kLimit);
  ASSERT_TRUE(pager);
  uint8_t* b = pager->base();
  for (size_t p = 0; p < kPages; ++p) FillPage(b + p * kPage, p, 1);
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  ASSERT_TRUE(pager->PrepareFork().ok());
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    pager->ChildAfterFork();
    char c;
    if (::read(go[0], &c, 1) != 1) ::_exit(2);
    size_t bad = 0;
    for (size_t p = 0; p < kPages; ++p) bad += BadBytes(b + p * kPage, p, 1);
    ::_exit(bad == 0 ? 0 : 1);
  }
  pager->ParentAfterFork(pid);
  for (size_t p = 0; p < kPages; ++p) FillPage(b + p * kPage, p, 2);
  ASSERT_EQ(::write(go[1], "x", 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child read wrong bytes";
  size_t bad = 0;
  for (size_t p = 0; p < kPages; ++p) bad += BadBytes(b + p * kPage, p, 2);
  EXPECT_EQ(bad, 0u);
  const PagerStats s = pager->Stats();
  EXPECT_EQ(s.fork_snapshots, 1u);
  EXPECT_GT(s.fork_preserved, 0u);
  EXPECT_GE(s.fork_child_faults, kPages - kLimit);
  EXPECT_EQ(s.fill_errors, 0u);
  EXPECT_LE(s.fork_child_peak_resident_pages, kLimit + kLimit / 4);
  EXPECT_LE(s.peak_resident_pages, kLimit + kLimit / 8 + 256);
}

TEST(PagerIntegrationTest, SurvivesRServersKilledMidRun) {
  constexpr size_t kPages = 4096, kLimit = 1024;
  Rig rig = StartRig(4, 2, kPages);
  ASSERT_TRUE(rig.store);
  auto pager = MakePager(rig.store.get(), kPages, kLimit);
  ASSERT_TRUE(pager);
  uint8_t* b = pager->base();
  for (size_t p = 0; p < kPages; ++p) FillPage(b + p * kPage, p, 1);
  // Kill r = 2 servers while a second thread keeps paging.
  std::atomic<bool> done{false};
  std::atomic<size_t> bad{0};
  std::thread reader([&] {
    for (int pass = 0; pass < 3 && !done.load(); ++pass) {
      for (size_t p = 0; p < kPages / 2; ++p) bad += BadBytes(b + p * kPage, p, 1);
    }
  });
  for (size_t p = kPages / 2; p < kPages; ++p) bad += BadBytes(b + p * kPage, p, 1);
  ASSERT_TRUE(rig.cluster->Kill(1).ok());
  ASSERT_TRUE(rig.cluster->Kill(4).ok());
  for (size_t p = kPages / 2; p < kPages; ++p) FillPage(b + p * kPage, p, 2);
  done = true;
  reader.join();
  for (size_t p = 0; p < kPages; ++p) bad += BadBytes(b + p * kPage, p, p < kPages / 2 ? 1 : 2);
  EXPECT_EQ(bad.load(), 0u);
  PagerStats s = pager->Stats();
  EXPECT_EQ(s.fill_errors, 0u);
  EXPECT_EQ(s.writeback_errors, 0u);
  EXPECT_GT(s.remote_reads, kPages / 2);
  // The killed servers are suspect at once and failed fail_after_ms later (bounded wait).
  const Deadline verdict = Deadline::AfterMs(20000);
  while (rig.store->Stats().server_failures == 0 && !verdict.Expired()) {
    std::this_thread::yield();
  }
  EXPECT_GE(rig.store->Stats().server_failures, 1u);
}

}  // namespace
}  // namespace tessera::kernel_shim
