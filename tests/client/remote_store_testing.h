// Helpers of the remote-store tests against real memservers (LocalCluster): a cluster, store
// options, page contents that are a function of (page, version), and the servers' STATS.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/local_cluster.h"
#include "client/remote_store.h"
#include "common/clock.h"
#include "fabric/control_client.h"
#include "tests/support/test_util.h"

namespace tessera::client::remote_testing {

inline constexpr int kWaitMs = 30000;

inline std::unique_ptr<LocalCluster> StartCluster(size_t n, const std::string& slab = "64K",
                                                  const std::string& capacity = "4M") {
  LocalClusterOptions o;
  o.bin_dir = testing::BinDir();
  o.servers = n;
  o.capacity = capacity;
  o.slab_size = slab;
  o.fault_injection = true;
  auto c = LocalCluster::Start(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

inline RemoteStoreOptions RemoteOptions(const LocalCluster& c, uint64_t pages) {
  RemoteStoreOptions o;
  for (const auto& e : c.endpoints()) o.servers.push_back(RemoteServer{e, ""});
  o.secret = c.secret();
  o.transport = fabric::TransportKind::kTcp;
  o.capacity_pages = pages;
  return o;
}

// RS(k,r) over every server of `c`, with the other settings at their defaults.
inline ErasureCodedStoreOptions EcOptions(const LocalCluster& c, uint64_t pages, int k, int r,
                                          EcLayout layout = EcLayout::kSplit) {
  ErasureCodedStoreOptions o;
  o.remote = RemoteOptions(c, pages);
  o.k = k;
  o.r = r;
  o.layout = layout;
  return o;
}

// Page content: a function of (page, version), so every page's hash can be checked.
inline void Fill(PageId page, uint32_t version, uint8_t* out) {
  uint64_t x = page * 0x9E3779B97F4A7C15ull + version * 0xC2B2AE3D27D4EB4Full + 1;
  for (size_t i = 0; i < kPageSize; i += 8) {
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    std::memcpy(out + i, &x, 8);
  }
}

inline bool Matches(PageId page, uint32_t version, const uint8_t* got) {
  uint8_t want[kPageSize];
  Fill(page, version, want);
  return std::memcmp(want, got, kPageSize) == 0;
}

inline Status WriteVersion(PageStore* s, PageId p, uint32_t v) {
  uint8_t buf[kPageSize];
  Fill(p, v, buf);
  return s->WritePage(p, buf);
}

// Writes pages [0, n) at version 1 in batches.
inline void WriteAll(PageStore* s, uint64_t n) {
  std::vector<uint8_t> bufs(64 * kPageSize);
  std::vector<PageId> ids(64);
  for (uint64_t first = 0; first < n; first += 64) {
    const size_t m = std::min<uint64_t>(64, n - first);
    for (size_t i = 0; i < m; ++i) {
      ids[i] = first + i;
      Fill(first + i, 1, bufs.data() + i * kPageSize);
    }
    ASSERT_TRUE(s->WritePages(ids.data(), m, bufs.data()).ok());
  }
}

// Reads every page in [0, n) and checks it against its expected version.
inline void VerifyAll(PageStore* s, const std::vector<uint32_t>& versions) {
  uint8_t buf[kPageSize];
  for (PageId p = 0; p < versions.size(); ++p) {
    Status st = s->ReadPage(p, buf);
    ASSERT_TRUE(st.ok()) << "page " << p << ": " << st;
    ASSERT_TRUE(Matches(p, versions[p], buf)) << "page " << p << " has wrong content";
  }
}

inline void WaitFor(const std::function<bool()>& cond, const char* what) {
  Deadline d = Deadline::AfterMs(kWaitMs);
  while (!cond()) {
    ASSERT_FALSE(d.Expired()) << "timed out after " << kWaitMs << " ms waiting for " << what;
    std::this_thread::yield();
  }
}

// Sum of a STATS counter over the cluster's live servers.
inline uint64_t SumServerStat(const LocalCluster& c, const std::string& key,
                              const std::vector<size_t>& skip = {}) {
  uint64_t sum = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    if (std::find(skip.begin(), skip.end(), i) != skip.end()) continue;
    fabric::ConnectOptions co;
    co.secret = c.secret();
    co.client_id = 777;
    auto conn = fabric::ControlClient::Connect(c.endpoints()[i], co);
    EXPECT_TRUE(conn.ok()) << conn.status();
    if (!conn.ok()) continue;
    auto text = (*conn)->Stats(Deadline::AfterMs(kWaitMs));
    EXPECT_TRUE(text.ok()) << text.status();
    if (!text.ok()) continue;
    size_t at = text->compare(0, key.size() + 1, key + " ") == 0 ? 0
                                                                 : text->find("\n" + key + " ");
    EXPECT_NE(at, std::string::npos) << key << " missing from " << *text;
    if (at == std::string::npos) continue;
    if (at > 0) ++at;  // Past the newline.
    sum += std::stoull(text->substr(at + key.size() + 1));
  }
  return sum;
}

inline bool IsZeroPage(const uint8_t* b) {
  return std::all_of(b, b + kPageSize, [](uint8_t x) { return x == 0; });
}

inline void ExpectZeros(PageStore* s, PageId first, PageId end) {
  uint8_t buf[kPageSize];
  for (PageId p = first; p < end; ++p) {
    std::memset(buf, 0xEE, kPageSize);
    ASSERT_TRUE(s->ReadPage(p, buf).ok()) << "page " << p;
    ASSERT_TRUE(IsZeroPage(buf)) << "trimmed page " << p << " does not read as zeros";
  }
}

inline void ExpectVersion(PageStore* s, PageId first, PageId end, uint32_t v) {
  uint8_t buf[kPageSize];
  for (PageId p = first; p < end; ++p) {
    ASSERT_TRUE(s->ReadPage(p, buf).ok()) << "page " << p;
    ASSERT_TRUE(Matches(p, v, buf)) << "page " << p << " lost its version " << v;
  }
}

}  // namespace tessera::client::remote_testing
