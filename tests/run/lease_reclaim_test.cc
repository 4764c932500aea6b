// Remote memory of a client that dies is given back: a SIGKILLed `tessera run` and a SIGKILLed
// `tessera nbd` leave no slab on the memservers once their lease (--orphan_grace) has run out,
// counted by `tessera status`. Both authenticate with one client token, as two jobs of one
// tenant would: each process is its own slab owner (fabric/auth.h, "Slab ownership"), so the
// killed one's slabs are reclaimed while the other, same credential, stays connected.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/local_cluster.h"
#include "common/clock.h"
#include "common/subprocess.h"
#include "tests/support/test_util.h"

namespace tessera {
namespace {

using testing::BinDir;
using testing::JsonLines;
using testing::RunCommand;
using testing::TempDir;

// Slabs in use over every server of the cluster, from `tessera status --json`; -1 when a
// server cannot be reached.
int64_t SlabsUsed(const client::LocalCluster& c) {
  auto out = RunCommand({BinDir() + "/tessera", "status", "--json", c.cluster_file_path(),
                         "--auth_token_file", c.token_path()},
                        30000);
  int64_t total = 0;
  int rows = 0;
  for (const auto& row : JsonLines(out.stdout_text)) {
    if (!row.contains("slabs_used") || !row["slabs_used"].is_number_integer()) return -1;
    total += row["slabs_used"].get<int64_t>();
    ++rows;
  }
  return rows == static_cast<int>(c.size()) ? total : -1;
}

// Waits (bounded) until `pred(slabs in use)` holds; returns the last count seen.
template <typename Pred>
int64_t WaitForSlabs(const client::LocalCluster& c, Pred pred, int timeout_ms) {
  const Deadline d = Deadline::AfterMs(timeout_ms);
  int64_t n = SlabsUsed(c);
  while (!pred(n) && !d.Expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // Polling a count, bounded.
    n = SlabsUsed(c);
  }
  return n;
}

TEST(LeaseReclaim, SigkilledRunAndNbdLeaveNoSlabBehindOnceTheirLeaseExpired) {
  client::LocalClusterOptions lo;
  lo.bin_dir = BinDir();
  lo.servers = 3;
  lo.capacity = "256M";
  lo.slab_size = "1M";
  // A short lease, checked often, so the test waits seconds rather than the default 30 s.
  lo.extra_flags = {"--orphan_grace=1s", "--monitor_interval=100ms"};
  auto cluster = client::LocalCluster::Start(lo);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const client::LocalCluster& c = **cluster;
  auto token = c.IssueCredentialFile("tenant");
  ASSERT_TRUE(token.ok()) << token.status();
  ASSERT_EQ(SlabsUsed(c), 0);

  // 1. An NBD export with the token, holding 8 MiB written by nbdcopy.
  Subprocess::Options so;
  so.capture_stdout = true;
  so.quiet_stderr = true;
  auto nbd =
      Subprocess::Start({BinDir() + "/tessera", "nbd", "--listen", "127.0.0.1:0", "--ephemeral",
                         "--size", "16M", "--k", "2", "--r", "1", "--layout", "split", "--cluster",
                         c.cluster_file_path(), "--auth_token_file", *token},
                        so);
  ASSERT_TRUE(nbd.ok()) << nbd.status();
  auto line = nbd->WaitForLine("nbd export", Deadline::AfterMs(60000));
  ASSERT_TRUE(line.ok()) << line.status();
  const std::string uri = line->substr(line->find("nbd://"));
  TempDir tmp;
  const std::string src = tmp.path() + "/src";
  {
    std::mt19937_64 rng(7);
    std::vector<uint64_t> buf((8u << 20) / 8);
    for (auto& w : buf) w = rng();
    std::ofstream(src, std::ios::binary)
        .write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(8u << 20));
  }
  auto copy = RunCommand({"nbdcopy", src, uri}, 120000, true);
  ASSERT_EQ(copy.exit_code, 0) << copy.stdout_text;
  const int64_t nbd_slabs = WaitForSlabs(
      c, [](int64_t n) { return n > 0; }, 30000);
  ASSERT_GT(nbd_slabs, 0) << "the export's writes allocated no slab";

  // 2. A paged program with the same token, holding 48 MiB with 4 MiB local.
  std::vector<std::string> run_argv = {BinDir() + "/tessera",
                                       "run",
                                       "--local-memory",
                                       "4M",
                                       "--region",
                                       "1G",
                                       "--k",
                                       "2",
                                       "--r",
                                       "1",
                                       "--spares",
                                       "0",
                                       "--layout",
                                       "split",
                                       "--cluster",
                                       c.cluster_file_path(),
                                       "--auth-token-file",
                                       *token,
                                       "--summary=false"};
  run_argv.insert(run_argv.end(), {"--", BinDir() + "/tessera-preload-probe", "hold", "48"});
  auto run = Subprocess::Start(run_argv, so);
  ASSERT_TRUE(run.ok()) << run.status();
  auto held = run->WaitForLine("holding", Deadline::AfterMs(120000));
  ASSERT_TRUE(held.ok()) << held.status();
  const int64_t both = WaitForSlabs(
      c, [&](int64_t n) { return n > nbd_slabs; }, 30000);
  ASSERT_GT(both, nbd_slabs) << "the program's pages allocated no slab";

  // 3. SIGKILL `tessera run` (its program dies with it): its slabs go once the lease expires,
  // while the export, same credential, stays connected and keeps every one of its own.
  ASSERT_TRUE(run->Signal(SIGKILL).ok());
  ASSERT_TRUE(run->Wait(Deadline::AfterMs(30000)).ok());
  int64_t left = WaitForSlabs(
      c, [&](int64_t n) { return n == nbd_slabs; }, 30000);
  EXPECT_EQ(left, nbd_slabs) << "slabs of the killed program: " << both - nbd_slabs
                             << " allocated, " << left - nbd_slabs << " still held";
  auto back = RunCommand({"nbdcopy", uri, tmp.path() + "/back"}, 120000, true);
  ASSERT_EQ(back.exit_code, 0) << back.stdout_text;
  EXPECT_EQ(RunCommand({"cmp", "-n", std::to_string(8u << 20), src, tmp.path() + "/back"}, 30000)
                .exit_code,
            0)
      << "the export lost data when the other process's slabs were reclaimed";

  // 4. SIGKILL the export: nothing is left.
  ASSERT_TRUE(nbd->Signal(SIGKILL).ok());
  ASSERT_TRUE(nbd->Wait(Deadline::AfterMs(30000)).ok());
  left = WaitForSlabs(
      c, [](int64_t n) { return n == 0; }, 30000);
  EXPECT_EQ(left, 0) << "slabs left behind by the killed export";
}

}  // namespace
}  // namespace tessera
