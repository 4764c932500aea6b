// Hosts on one machine (client/hosts.h): the --pin parser, and real memservers in network
// namespaces through LocalCluster (hosts = netns): a real erasure-coded store reads and writes
// across namespaces, one host is partitioned and healed, servers are pinned, and
// `tessera cluster up` cleans up after SIGTERM, after a SIGKILL (the next sweep), and falls
// back to loopback where it cannot make namespaces.
#include "client/hosts.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "client/local_cluster.h"
#include "client/remote_store.h"
#include "common/clock.h"
#include "common/subprocess.h"
#include "fabric/control_client.h"
#include "tests/support/test_util.h"

namespace tessera::client {
namespace {

TEST(PinTest, ParsesRolesRangesAndJoins) {
  const std::vector<int> cpus = {0, 1, 2, 3};
  auto p = ParsePin("client:0,servers:1", cpus);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->client, std::vector<int>({0}));
  EXPECT_EQ(p->servers, std::vector<int>({1}));
  p = ParsePin("servers:1-3,client:0", cpus);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->servers, std::vector<int>({1, 2, 3}));
  EXPECT_EQ(FormatPin(*p), "client:0,servers:1-3");
  p = ParsePin("client:0+2", cpus);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->client, std::vector<int>({0, 2}));
  EXPECT_TRUE(p->servers.empty());
  EXPECT_EQ(FormatPin(*p), "client:0+2");
  EXPECT_EQ(ParsePin(FormatPin(*p), cpus)->client, p->client);  // Round trip.
  EXPECT_TRUE(ParsePin("none", cpus)->empty());
  EXPECT_TRUE(ParsePin("", cpus)->empty());
  EXPECT_EQ(FormatPin(PinPlan{}), "none");
  p = ParsePin("auto", cpus);
  EXPECT_EQ(p->client, std::vector<int>({0}));
  EXPECT_EQ(p->servers, std::vector<int>({1, 2, 3}));
  EXPECT_TRUE(ParsePin("auto", std::vector<int>{0})->empty());  // One CPU: nothing to separate.
}

TEST(PinTest, RejectsBadValuesWithTheReason) {
  const std::vector<int> cpus = {0, 1};
  const std::map<std::string, std::string> bad = {
      {"client", "is not ROLE:CPUS"},
      {"client:", "names no CPU"},
      {"client:x", "is not a CPU number"},
      {"client:-1", "is not a CPU number"},
      {"client:2", "CPU 2 is not one this process may use"},
      {"client:1-0", "backwards"},
      {"client:0+0", "twice"},
      {"client:0,client:1", "named twice"},
      {"server:1", "unknown role 'server'"},
      {"client:0,", "is not ROLE:CPUS"},
      {"client:99999", "is not a CPU number"},
  };
  for (const auto& [text, why] : bad) {
    auto p = ParsePin(text, cpus);
    ASSERT_FALSE(p.ok()) << text;
    EXPECT_NE(p.status().message().find(why), std::string::npos)
        << text << ": " << p.status().message();
  }
  EXPECT_TRUE(ParseHostsMode("netns").ok());
  EXPECT_TRUE(ParseHostsMode("loopback").ok());
  EXPECT_FALSE(ParseHostsMode("veth").ok());
}

// The CPUs a process may run on, from /proc/PID/status ("Cpus_allowed_list:\t1").
std::string AllowedList(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Cpus_allowed_list:", 0) == 0) return line.substr(line.find_last_of("\t ") + 1);
  }
  return "";
}

bool InBenchmarkRange(const std::string& address) {
  return address.rfind("198.18.", 0) == 0 || address.rfind("198.19.", 0) == 0;
}

// Whether a fresh control connection to `e` gets through within `ms`.
bool Reachable(const LocalCluster& c, const fabric::Endpoint& e, uint64_t ms) {
  fabric::ConnectOptions co;
  co.secret = c.secret();
  co.client_id = 4242;
  co.deadline = Deadline::AfterMs(ms);
  return fabric::ControlClient::Connect(e, co).ok();
}

void Fill(PageId page, uint8_t* out) {
  for (size_t i = 0; i < kPageSize; ++i) out[i] = static_cast<uint8_t>(page * 131 + i * 7 + 1);
}

class NetnsClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  }
};

TEST_F(NetnsClusterTest, StoreReadsAndWritesAcrossNamespacesAndSurvivesAPartitionedHost) {
  const std::vector<int> allowed = AllowedCpus();
  LocalClusterOptions o;
  o.bin_dir = testing::BinDir();
  o.servers = 3;
  o.capacity = "8M";
  o.slab_size = "256K";
  o.fault_injection = true;
  o.hosts = HostsMode::kNetns;
  o.pin = AutoPin(allowed);
  auto started = LocalCluster::Start(o);
  ASSERT_TRUE(started.ok()) << started.status();
  LocalCluster& c = **started;
  ASSERT_EQ(c.hosts(), HostsMode::kNetns) << c.hosts_note();
  ASSERT_NE(c.net_hosts(), nullptr);
  EXPECT_EQ(c.net_hosts()->size(), 4u);  // Three servers and the client host.
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(InBenchmarkRange(c.endpoints()[i].host)) << c.endpoints()[i].ToString();
    EXPECT_EQ(c.endpoints()[i].host, c.net_hosts()->host(i).address);
    EXPECT_TRUE(std::filesystem::exists(c.net_hosts()->host(i).netns_path));
    if (!o.pin.servers.empty()) {
      EXPECT_EQ(AllowedList(c.pid(i)), FormatPin({{}, o.pin.servers}).substr(8));
    }
  }
  EXPECT_NE(testing::ReadFile(c.cluster_file_path()).find(c.endpoints()[2].ToString()),
            std::string::npos);

  // A real erasure-coded store in this (the caller's) namespace, over the bridge.
  ErasureCodedStoreOptions so;
  for (const auto& e : c.endpoints()) so.remote.servers.push_back(RemoteServer{e, ""});
  so.remote.secret = c.secret();
  so.remote.transport = fabric::TransportKind::kTcp;
  so.remote.capacity_pages = 256;
  so.k = 2;
  so.r = 1;
  so.delta = 1;  // Reads ask all three, so none waits on the partitioned one.
  so.layout = EcLayout::kSplit;
  auto store = CreateErasureCodedStore(so);
  ASSERT_TRUE(store.ok()) << store.status();
  uint8_t buf[kPageSize], want[kPageSize];
  for (PageId p = 0; p < 256; ++p) {
    Fill(p, buf);
    ASSERT_TRUE((*store)->WritePage(p, buf).ok()) << p;
  }
  ASSERT_TRUE((*store)->Flush().ok());
  for (PageId p = 0; p < 256; ++p) {
    ASSERT_TRUE((*store)->ReadPage(p, buf).ok()) << p;
    Fill(p, want);
    ASSERT_EQ(std::memcmp(buf, want, kPageSize), 0) << "page " << p;
  }

  // Partition host 2: nothing reaches it, yet every page still reads (from the other two).
  ASSERT_TRUE(c.Partition(2).ok());
  EXPECT_FALSE(Reachable(c, c.endpoints()[2], 1500)) << "a partitioned host answered";
  EXPECT_TRUE(Reachable(c, c.endpoints()[0], 10000));
  EXPECT_TRUE(c.Running(2));  // The process lives on; only its link is down.
  for (PageId p = 0; p < 256; ++p) {
    ASSERT_TRUE((*store)->ReadPage(p, buf).ok()) << p;
    Fill(p, want);
    ASSERT_EQ(std::memcmp(buf, want, kPageSize), 0) << "page " << p << " during the partition";
  }
  // Healed: it answers again.
  ASSERT_TRUE(c.Heal(2).ok());
  EXPECT_TRUE(Reachable(c, c.endpoints()[2], 10000)) << "host 2 unreachable after Heal";

  // The control path works across namespaces: faults, stop/cont, restart on the same address.
  EXPECT_TRUE(c.Fault(1, {"clear"}).ok());
  ASSERT_TRUE(c.Stop(1).ok());
  ASSERT_TRUE(c.Cont(1).ok());
  const pid_t before = c.pid(0);
  const Status restarted = c.Restart(0);
  ASSERT_TRUE(restarted.ok()) << restarted;
  EXPECT_NE(c.pid(0), before);
  const Status answered = c.Fault(0, {"clear"});
  EXPECT_TRUE(answered.ok()) << answered;
  EXPECT_FALSE(c.Partition(9).ok());
  store->reset();

  // A client process on the client host (its own namespace and CPUs) reaches the servers.
  Subprocess::Options po;
  po.capture_stdout = true;
  auto client = c.StartOnClientHost({testing::BinDir() + "/tessera", "status",
                                     c.cluster_file_path(),
                                     "--auth_token_file=" + c.token_path()},
                                    po);
  ASSERT_TRUE(client.ok()) << client.status();
  std::string out;
  const Deadline d = Deadline::AfterMs(30000);
  for (auto line = client->ReadLine(d); line.ok(); line = client->ReadLine(d)) out += *line + "\n";
  auto ws = client->Wait(d);
  ASSERT_TRUE(ws.ok());
  EXPECT_TRUE(WIFEXITED(*ws) && WEXITSTATUS(*ws) == 0) << out;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NE(out.find(c.endpoints()[i].ToString()), std::string::npos) << out;
  }

  ASSERT_TRUE(c.Kill(1).ok());
  EXPECT_FALSE(c.Running(1));

  // Teardown removes the namespaces, links and bridge.
  std::vector<std::string> paths, links;
  for (size_t i = 0; i < c.net_hosts()->size(); ++i) {
    paths.push_back(c.net_hosts()->host(i).netns_path);
    links.push_back(c.net_hosts()->host(i).link);
  }
  links.push_back(c.net_hosts()->bridge());
  started->reset();
  for (const auto& p : paths) EXPECT_FALSE(std::filesystem::exists(p)) << p;
  for (const auto& l : links) EXPECT_FALSE(std::filesystem::exists("/sys/class/net/" + l)) << l;
}

TEST_F(NetnsClusterTest, LoopbackClusterRefusesPartition) {
  LocalClusterOptions o;
  o.bin_dir = testing::BinDir();
  o.servers = 1;
  auto c = LocalCluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->hosts(), HostsMode::kLoopback);
  EXPECT_EQ((*c)->net_hosts(), nullptr);
  const Status st = (*c)->Partition(0);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("netns"), std::string::npos) << st;
}

// `tessera cluster up` as a child; its output up to the "up;" line.
struct ClusterUp {
  Subprocess proc;
  std::map<std::string, std::string> fields;  // "cluster file" -> path, "server 0" -> ...
  std::vector<std::string> netns;
  std::string out;
};

ClusterUp StartClusterUp(const std::vector<std::string>& args,
                         const std::vector<std::string>& prefix = {}) {
  ClusterUp cu;
  std::vector<std::string> argv = prefix;
  argv.push_back(testing::BinDir() + "/tessera");
  argv.push_back("cluster");
  argv.push_back("up");
  argv.insert(argv.end(), args.begin(), args.end());
  Subprocess::Options so;
  so.capture_stdout = true;
  so.stderr_to_stdout = true;
  auto p = Subprocess::Start(argv, so);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return cu;
  cu.proc = std::move(*p);
  const Deadline d = Deadline::AfterMs(30000);
  for (;;) {
    auto line = cu.proc.ReadLine(d);
    if (!line.ok()) {
      ADD_FAILURE() << "tessera cluster up did not come up: " << line.status() << "\n" << cu.out;
      return cu;
    }
    cu.out += *line + "\n";
    if (line->rfind("up;", 0) == 0) break;
    const size_t colon = line->find(": ");
    if (colon != std::string::npos) cu.fields[line->substr(0, colon)] = line->substr(colon + 2);
    const size_t ns = line->find("netns tessera-");
    if (ns != std::string::npos) {
      std::string name = line->substr(ns + 6);
      name = name.substr(0, name.find_first_of(",) "));
      cu.netns.push_back(name);
    }
  }
  return cu;
}

TEST_F(NetnsClusterTest, ClusterUpServesUntilSigtermAndRemovesEverything) {
  ClusterUp cu = StartClusterUp({"--hosts=2", "--capacity=8M"});
  ASSERT_EQ(cu.fields["hosts"], "netns") << cu.out;
  ASSERT_EQ(cu.netns.size(), 3u) << cu.out;
  const std::string cluster_file = cu.fields["cluster file"];
  auto status = testing::RunTessera(
      {"status", cluster_file, "--auth_token_file=" + cu.fields["token file"]}, 30000);
  EXPECT_EQ(status.exit_code, 0) << status.stdout_text;
  EXPECT_NE(status.stdout_text.find("198.1"), std::string::npos) << status.stdout_text;
  for (const auto& n : cu.netns) EXPECT_TRUE(std::filesystem::exists("/run/netns/" + n)) << n;

  ASSERT_TRUE(cu.proc.Signal(SIGTERM).ok());
  std::string rest;
  const Deadline d = Deadline::AfterMs(30000);
  for (auto line = cu.proc.ReadLine(d); line.ok(); line = cu.proc.ReadLine(d)) rest += *line + "\n";
  auto ws = cu.proc.Wait(d);
  ASSERT_TRUE(ws.ok());
  EXPECT_TRUE(WIFEXITED(*ws) && WEXITSTATUS(*ws) == 0) << rest;
  EXPECT_NE(rest.find("stopped (SIGTERM)"), std::string::npos) << rest;
  for (const auto& n : cu.netns) EXPECT_FALSE(std::filesystem::exists("/run/netns/" + n)) << n;
  EXPECT_FALSE(std::filesystem::exists(cluster_file));
}

TEST_F(NetnsClusterTest, NextSweepRemovesWhatAKilledHarnessLeft) {
  ClusterUp cu = StartClusterUp({"--hosts=2", "--capacity=8M"});
  ASSERT_EQ(cu.netns.size(), 3u) << cu.out;
  // tessera-K-I: the harness's subnet K names its bridge, veths and claim.
  const std::string k = cu.netns[0].substr(8, cu.netns[0].rfind('-') - 8);
  const std::string bridge = "/sys/class/net/tsb" + k;
  const std::string claim = "/run/tessera-hosts/net-" + k;
  ASSERT_TRUE(std::filesystem::exists(bridge)) << bridge;
  ASSERT_TRUE(std::filesystem::exists(claim)) << claim;

  ASSERT_TRUE(cu.proc.Signal(SIGKILL).ok());
  ASSERT_TRUE(cu.proc.Wait(Deadline::AfterMs(10000)).ok());
  // Its memservers die with it (PR_SET_PDEATHSIG); its namespaces, links and claim stay.
  for (const auto& n : cu.netns) EXPECT_TRUE(std::filesystem::exists("/run/netns/" + n)) << n;
  EXPECT_TRUE(std::filesystem::exists(bridge));

  // Any harness's next start sweeps them (another one may have swept first: either way the
  // leftovers must be gone).
  auto swept = NetHosts::SweepLeftovers();
  ASSERT_TRUE(swept.ok()) << swept.status();
  for (const auto& n : cu.netns) EXPECT_FALSE(std::filesystem::exists("/run/netns/" + n)) << n;
  EXPECT_FALSE(std::filesystem::exists(bridge));
  EXPECT_FALSE(std::filesystem::exists(claim));
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(std::filesystem::exists("/sys/class/net/tsv" + k + "h" + std::to_string(i)));
  }
  // Its temporary directory (token, cluster file) is no namespace: the test removes it.
  std::error_code ec;
  std::filesystem::remove_all(std::filesystem::path(cu.fields["cluster file"]).parent_path(), ec);
}

TEST_F(NetnsClusterTest, WithoutPrivilegeItSaysWhyAndFallsBackToLoopback) {
  if (::access("/usr/bin/setpriv", X_OK) != 0) GTEST_SKIP() << "no setpriv to drop root";
  // As nobody, with no capabilities: namespaces cannot be made.
  ClusterUp cu = StartClusterUp({"--hosts=1", "--capacity=8M", "--pin=none"},
                                {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                                 "--clear-groups", "--inh-caps=-all"});
  EXPECT_EQ(cu.fields["hosts"], "loopback") << cu.out;
  EXPECT_NE(cu.out.find("cannot create network namespaces: not root"), std::string::npos)
      << cu.out;
  EXPECT_NE(cu.out.find("server 0: 127.0.0.1:"), std::string::npos) << cu.out;
  EXPECT_TRUE(cu.netns.empty());
  ASSERT_TRUE(cu.proc.Signal(SIGINT).ok());
  auto ws = cu.proc.Wait(Deadline::AfterMs(30000));
  ASSERT_TRUE(ws.ok());
  EXPECT_TRUE(WIFEXITED(*ws) && WEXITSTATUS(*ws) == 0);
}

}  // namespace
}  // namespace tessera::client
