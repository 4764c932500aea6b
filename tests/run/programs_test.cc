// `tessera run` with real, unmodified programs at 50% local memory: python3 on a
// data-structure-heavy script, GNU sort with a big in-memory buffer, redis-server under a
// loader and redis-benchmark, memcached under a loader. Each paged run must produce exactly what
// the unpaged run produces, also when r memservers of its cluster are SIGKILLed half way
// (at a line the program or its loader prints, or once the shim's live stats show remote
// writes: never after a sleep).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "client/local_cluster.h"
#include "common/clock.h"
#include "common/subprocess.h"
#include "kernel_shim/preload/run_stats.h"
#include "tests/support/test_util.h"

namespace tessera {
namespace {

using testing::BinDir;
using testing::RunCommand;
using testing::JsonInt;
using testing::ReadFile;
using testing::TempDir;

constexpr int kK = 4, kR = 2;
const std::string kPython = "/usr/bin/python3";
const std::string kDir = TESSERA_RUN_TEST_DIR;




bool CanConnect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

// A cluster of k+2r memservers the test owns, so it can kill r of them and still have the
// k+r servers a write needs (the store does not write degraded stripes).
std::unique_ptr<client::LocalCluster> StartCluster() {
  client::LocalClusterOptions lo;
  lo.bin_dir = BinDir();
  lo.servers = kK + 2 * kR;
  lo.capacity = "2G";
  lo.slab_size = "1M";
  auto c = client::LocalCluster::Start(lo);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

// `tessera run --local-memory 50% ... --` (on `cluster` when given, else embedded).
std::vector<std::string> RunPrefix(const std::string& json, client::LocalCluster* cluster,
                                   const std::string& live = "",
                                   const std::vector<std::string>& extra = {}) {
  std::vector<std::string> a = {BinDir() + "/tessera", "run", "--local-memory", "50%",
                                "--k", std::to_string(kK), "--r", std::to_string(kR),
                                "--stats-json", json, "--region", "4G"};
  if (cluster != nullptr) {
    a.insert(a.end(), {"--cluster", cluster->cluster_file_path(), "--auth-token-file",
                       cluster->token_path()});
  }
  if (!live.empty()) a.insert(a.end(), {"--live-stats-file", live});
  a.insert(a.end(), extra.begin(), extra.end());
  a.push_back("--");
  return a;
}

void KillR(client::LocalCluster* cluster) {
  for (int i = 0; i < kR; ++i) {
    Status st = cluster->Kill(static_cast<size_t>(i));
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
}

// Paging happened and nothing was lost; with failures, the store saw them.
void ExpectPagedCleanly(const std::string& json_path, bool failures) {
  const std::string j = ReadFile(json_path);
  ASSERT_FALSE(j.empty()) << "no --stats-json written";
  auto parsed = nlohmann::json::parse(j, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(parsed.is_object()) << "not a JSON object: " << j;
  EXPECT_EQ(parsed.value("stats_final", false), true) << j;
  EXPECT_GT(JsonInt(j, "remote_writes"), 0) << "nothing was paged out: " << j;
  EXPECT_GT(JsonInt(j, "remote_reads"), 0) << "nothing was paged back in: " << j;
  EXPECT_EQ(JsonInt(j, "fill_errors"), 0) << j;
  EXPECT_EQ(JsonInt(j, "store_data_loss"), 0) << j;
  if (failures) {
    EXPECT_GE(JsonInt(j, "store_server_failures"), 1) << "killed servers not noticed: " << j;
  }
}

std::string LastLineWith(const std::string& text, const std::string& prefix) {
  std::string found, line;
  std::istringstream in(text);
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) found = line;
  }
  return found;
}

// ---- python3 --------------------------------------------------------------------------------
const std::string kRecords = "120000";

std::string PythonUnpaged() {
  auto out = RunCommand({kPython, kDir + "/workload.py", kRecords}, 120000);
  EXPECT_EQ(out.exit_code, 0);
  std::string d = LastLineWith(out.stdout_text, "tessera-workload: records");
  EXPECT_FALSE(d.empty()) << out.stdout_text;
  return d;
}

TEST(Programs, PythonAtHalfLocalMemoryMatchesUnpaged) {
  const std::string want = PythonUnpaged();
  TempDir tmp;
  auto argv = RunPrefix(tmp.path() + "/s.json", nullptr);
  argv.insert(argv.end(), {kPython, kDir + "/workload.py", kRecords});
  auto out = RunCommand(argv, 300000, true);
  ASSERT_EQ(out.exit_code, 0) << out.stdout_text;
  EXPECT_EQ(LastLineWith(out.stdout_text, "tessera-workload: records"), want);
  ExpectPagedCleanly(tmp.path() + "/s.json", false);
}

// Polls the shim's live stats (rewritten twice a second) until `key` reaches `min`; fails if
// the program ends first or 240 s pass.
::testing::AssertionResult WaitForLiveStat(Subprocess* p, const std::string& live,
                                           const std::string& key, uint64_t min) {
  Deadline d = Deadline::AfterMs(240000);
  while (!d.Expired() && !p->Poll()) {
    if (kernel_shim::ParseRunStats(ReadFile(live))[key] >= min) {
      return ::testing::AssertionSuccess();
    }
    usleep(20000);  // polling the live stats file
  }
  return ::testing::AssertionFailure() << key << " never reached " << min
                                       << " before the program ended";
}

// python3 on a cluster the test owns (`tessera run` with `extra` flags): r memservers are
// SIGKILLed once it printed "half" and, when `stat` is given, once the shim's live stats show
// at least `min` of it; the output must still be the unpaged run's. `check` then reads the
// --stats-json.
void PythonKillTest(const std::vector<std::string>& extra, const std::string& stat = "",
                    uint64_t min = 0,
                    const std::function<void(const std::string&)>& check = nullptr) {
  const std::string want = PythonUnpaged();
  auto cluster = StartCluster();
  ASSERT_NE(cluster, nullptr);
  TempDir tmp;
  const std::string live = tmp.path() + "/live";
  auto argv = RunPrefix(tmp.path() + "/s.json", cluster.get(), live, extra);
  argv.insert(argv.end(), {kPython, kDir + "/workload.py", kRecords});
  auto p = Subprocess::Start(argv, {.capture_stdout = true});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto half = p->WaitForLine("tessera-workload: half", Deadline::AfterMs(240000));
  ASSERT_TRUE(half.ok()) << half.status().ToString();
  if (!stat.empty()) {
    ASSERT_TRUE(WaitForLiveStat(&*p, live, stat, min));
  }
  KillR(cluster.get());
  auto done = p->WaitForLine("tessera-workload: records", Deadline::AfterMs(240000));
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(*done, want);
  auto st = p->Wait(Deadline::AfterMs(60000));
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << *st;
  ExpectPagedCleanly(tmp.path() + "/s.json", true);
  if (check) check(tmp.path() + "/s.json");
}

TEST(Programs, PythonSurvivesRMemserversKilledHalfWay) { PythonKillTest({}); }

// With the compressed tier: faults on pages in the tier are served locally, every page is
// written back, and after r memservers are SIGKILLed (once write-back has stored pages on them)
// the pages the tier dropped are still read back from the survivors.
const std::vector<std::string> kTierOn = {"--compressed-tier", "auto"};

void ExpectTierServed(const std::string& json_path) {
  const std::string j = ReadFile(json_path);
  EXPECT_GT(JsonInt(j, "tier_hits"), 0) << "no fault was served from the tier: " << j;
  EXPECT_GT(JsonInt(j, "tier_misses"), 0) << "no page came from the memservers: " << j;
  EXPECT_GT(JsonInt(j, "tier_writebacks"), 0) << "the tier wrote nothing back: " << j;
  EXPECT_GT(JsonInt(j, "store_reads"), 0) << j;
  EXPECT_EQ(JsonInt(j, "tier_writeback_errors"), 0) << j;
}

TEST(Programs, PythonWithCompressedTierMatchesUnpaged) {
  const std::string want = PythonUnpaged();
  TempDir tmp;
  auto argv = RunPrefix(tmp.path() + "/s.json", nullptr, "", kTierOn);
  argv.insert(argv.end(), {kPython, kDir + "/workload.py", kRecords});
  auto out = RunCommand(argv, 300000, true);
  ASSERT_EQ(out.exit_code, 0) << out.stdout_text;
  EXPECT_EQ(LastLineWith(out.stdout_text, "tessera-workload: records"), want);
  ExpectPagedCleanly(tmp.path() + "/s.json", false);
  ExpectTierServed(tmp.path() + "/s.json");
}

TEST(Programs, PythonWithCompressedTierSurvivesRMemserversKilledAfterWriteBack) {
  // Once the live stats show pages written back (the shim rewrites them twice a second).
  PythonKillTest(kTierOn, "tier_writebacks", 1000, ExpectTierServed);
}

// ---- GNU sort ---------------------------------------------------------------------------------
void WriteSortInput(const std::string& path, size_t lines) {
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i < lines; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::fprintf(f, "%016llx %zu the quick brown fox %llu\n", static_cast<unsigned long long>(x), i,
                 static_cast<unsigned long long>(x % 100000));
  }
  std::fclose(f);
}

// GNU sort; with `kill`, r memservers are SIGKILLed once 2000 pages (8 MB) were written to them
// (by the tier's write-back when `tier`).
void SortTest(bool kill, bool tier = false) {
  setenv("LC_ALL", "C", 1);
  TempDir tmp;
  const std::string in = tmp.path() + "/in", want = tmp.path() + "/want", got = tmp.path() + "/got";
  WriteSortInput(in, 400000);  // ~23 MB
  auto ref = RunCommand({"/usr/bin/sort", "-S", "100M", in, "-o", want}, 120000);
  ASSERT_EQ(ref.exit_code, 0);
  std::unique_ptr<client::LocalCluster> cluster;
  if (kill) {
    cluster = StartCluster();
    ASSERT_NE(cluster, nullptr);
  }
  const std::string live = tmp.path() + "/live";
  auto argv = RunPrefix(tmp.path() + "/s.json", cluster.get(), live,
                        tier ? kTierOn : std::vector<std::string>{});
  argv.insert(argv.end(), {"/usr/bin/sort", "-S", "100M", in, "-o", got});
  auto p = Subprocess::Start(argv, {.capture_stdout = true});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  if (kill) {
    ASSERT_TRUE(WaitForLiveStat(&*p, live, tier ? "tier_writebacks" : "remote_writes", 2000));
    KillR(cluster.get());
  }
  auto st = p->Wait(Deadline::AfterMs(240000));
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << *st;
  const std::string a = ReadFile(want), b = ReadFile(got);
  EXPECT_EQ(a.size(), b.size());
  EXPECT_TRUE(a == b) << "sorted output differs from the unpaged sort";
  ExpectPagedCleanly(tmp.path() + "/s.json", kill);
  if (tier) ExpectTierServed(tmp.path() + "/s.json");
}

TEST(Programs, SortAtHalfLocalMemoryMatchesUnpaged) { SortTest(false); }
TEST(Programs, SortSurvivesRMemserversKilledHalfWay) { SortTest(true); }
TEST(Programs, SortWithCompressedTierSurvivesRMemserversKilledAfterWriteBack) {
  SortTest(true, true);
}

// ---- redis-server ---------------------------------------------------------------------------
constexpr int kKeys = 60000;

// Starts redis (paged when `prefix` is non-empty), loads it (killing r servers of `cluster`
// at half), runs redis-benchmark, and returns "LOADER-DIGEST DEBUG-DIGEST".
std::string RedisRun(const std::vector<std::string>& prefix, client::LocalCluster* kill) {
  const int port = testing::ListenPort();
  std::vector<std::string> argv = prefix;
  argv.insert(argv.end(), {"/usr/bin/redis-server", "--port", std::to_string(port), "--bind",
                           "127.0.0.1", "--save", "", "--appendonly", "no",
                           "--enable-debug-command", "local"});
  auto server = Subprocess::Start(argv, {.capture_stdout = true});
  EXPECT_TRUE(server.ok());
  if (!server.ok()) return "";
  Deadline d = Deadline::AfterMs(60000);
  for (;;) {
    auto line = server->ReadLine(d);
    if (!line.ok()) {
      ADD_FAILURE() << "redis never became ready: " << line.status().ToString();
      return "";
    }
    if (line->find("Ready to accept connections") != std::string::npos) break;
  }
  auto loader = Subprocess::Start({kPython, kDir + "/kv_loader.py", "redis", std::to_string(port),
                                   std::to_string(kKeys)},
                                  {.capture_stdout = true});
  EXPECT_TRUE(loader.ok());
  if (!loader.ok()) return "";
  auto half = loader->WaitForLine("kv-loader: half", Deadline::AfterMs(240000));
  EXPECT_TRUE(half.ok()) << half.status().ToString();
  if (kill != nullptr) KillR(kill);
  auto verified = loader->WaitForLine("kv-loader: verified", Deadline::AfterMs(240000));
  EXPECT_TRUE(verified.ok()) << verified.status().ToString();
  // redis-benchmark without -r touches fixed keys with fixed values: a deterministic dataset.
  auto bench = RunCommand({"/usr/bin/redis-benchmark", "-p", std::to_string(port), "-q", "-n",
                           "20000", "-d", "200", "-t", "set,get,lpush,lrange_100"},
                          240000);
  EXPECT_EQ(bench.exit_code, 0) << bench.stdout_text;
  auto digest = RunCommand({"/usr/bin/redis-cli", "-p", std::to_string(port), "DEBUG", "DIGEST"},
                           60000);
  EXPECT_EQ(digest.exit_code, 0);
  RunCommand({"/usr/bin/redis-cli", "-p", std::to_string(port), "SHUTDOWN", "NOSAVE"}, 60000);
  auto st = server->Wait(Deadline::AfterMs(60000));
  EXPECT_TRUE(st.ok());
  return (verified.ok() ? *verified : "") + " " + digest.stdout_text;
}

void RedisTest(bool kill) {
  const std::string want = RedisRun({}, nullptr);
  std::unique_ptr<client::LocalCluster> cluster;
  if (kill) {
    cluster = StartCluster();
    ASSERT_NE(cluster, nullptr);
  }
  TempDir tmp;
  const std::string got = RedisRun(RunPrefix(tmp.path() + "/s.json", cluster.get()), cluster.get());
  EXPECT_EQ(got, want);
  ExpectPagedCleanly(tmp.path() + "/s.json", kill);
}

TEST(Programs, RedisAtHalfLocalMemoryMatchesUnpaged) { RedisTest(false); }
TEST(Programs, RedisSurvivesRMemserversKilledHalfWay) { RedisTest(true); }

// ---- memcached --------------------------------------------------------------------------------
std::string MemcachedRun(const std::vector<std::string>& prefix, client::LocalCluster* kill) {
  const int port = testing::ListenPort();
  std::vector<std::string> argv = prefix;
  argv.insert(argv.end(), {"/usr/bin/memcached", "-p", std::to_string(port), "-l", "127.0.0.1",
                           "-U", "0", "-m", "1024", "-u", "root", "-t", "2"});
  auto server = Subprocess::Start(argv, {.capture_stdout = true});
  EXPECT_TRUE(server.ok());
  if (!server.ok()) return "";
  Deadline d = Deadline::AfterMs(60000);
  while (!CanConnect(port)) {
    if (d.Expired() || server->Poll()) {
      ADD_FAILURE() << "memcached never accepted connections";
      return "";
    }
    usleep(20000);  // polling for the listening socket
  }
  auto loader = Subprocess::Start({kPython, kDir + "/kv_loader.py", "memcached",
                                   std::to_string(port), std::to_string(kKeys)},
                                  {.capture_stdout = true});
  EXPECT_TRUE(loader.ok());
  if (!loader.ok()) return "";
  auto half = loader->WaitForLine("kv-loader: half", Deadline::AfterMs(240000));
  EXPECT_TRUE(half.ok()) << half.status().ToString();
  if (kill != nullptr) KillR(kill);
  auto verified = loader->WaitForLine("kv-loader: verified", Deadline::AfterMs(240000));
  EXPECT_TRUE(verified.ok()) << verified.status().ToString();
  (void)server->Signal(SIGTERM);
  auto st = server->Wait(Deadline::AfterMs(60000));
  EXPECT_TRUE(st.ok());
  return verified.ok() ? *verified : "";
}

void MemcachedTest(bool kill) {
  const std::string want = MemcachedRun({}, nullptr);
  ASSERT_FALSE(want.empty());
  std::unique_ptr<client::LocalCluster> cluster;
  if (kill) {
    cluster = StartCluster();
    ASSERT_NE(cluster, nullptr);
  }
  TempDir tmp;
  EXPECT_EQ(MemcachedRun(RunPrefix(tmp.path() + "/s.json", cluster.get()), cluster.get()), want);
  ExpectPagedCleanly(tmp.path() + "/s.json", kill);
}

TEST(Programs, MemcachedAtHalfLocalMemoryMatchesUnpaged) { MemcachedTest(false); }
TEST(Programs, MemcachedSurvivesRMemserversKilledHalfWay) { MemcachedTest(true); }

}  // namespace
}  // namespace tessera
