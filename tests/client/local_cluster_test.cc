// LocalCluster against real `tessera memserver` processes: start, cluster file, signals, faults.
#include "client/local_cluster.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "fabric/cluster_file.h"
#include "tests/support/test_util.h"

namespace tessera::client {
namespace {

TEST(LocalClusterTest, StartsServersWritesClusterFileAndControlsThem) {
  LocalClusterOptions o;
  o.bin_dir = testing::BinDir();
  o.servers = 3;
  o.capacity = "4M";
  o.slab_size = "256K";
  o.fault_injection = true;
  auto c = LocalCluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status();
  LocalCluster& cluster = **c;
  ASSERT_EQ(cluster.size(), 3u);
  EXPECT_GE(cluster.secret().size(), 16u);

  auto members = fabric::LoadClusterFile(cluster.cluster_file_path());
  ASSERT_TRUE(members.ok()) << members.status();
  ASSERT_EQ(members->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*members)[i].endpoint.ToString(), cluster.endpoints()[i].ToString());
    EXPECT_NE(cluster.endpoints()[i].port, 0);
    EXPECT_TRUE(cluster.Running(i));
  }

  // `tessera status` reads the same cluster file and token.
  auto status = testing::RunTessera(
      {"status", cluster.cluster_file_path(), "--auth_token_file=" + cluster.token_path()},
      30000);
  EXPECT_EQ(status.exit_code, 0) << status.stdout_text;
  EXPECT_NE(status.stdout_text.find(cluster.endpoints()[1].ToString()), std::string::npos)
      << status.stdout_text;

  EXPECT_TRUE(cluster.Fault(0, {"delay", "100us"}).ok());
  EXPECT_TRUE(cluster.Fault(0, {"clear"}).ok());
  EXPECT_FALSE(cluster.Fault(0, {"no-such-action"}).ok());

  ASSERT_TRUE(cluster.Stop(1).ok());
  ASSERT_TRUE(cluster.Cont(1).ok());
  EXPECT_TRUE(cluster.Running(1));
  ASSERT_TRUE(cluster.Kill(2).ok());
  EXPECT_FALSE(cluster.Running(2));
  EXPECT_TRUE(cluster.Kill(2).ok());  // Already gone: still OK.
  EXPECT_FALSE(cluster.Kill(7).ok());
}

TEST(LocalClusterTest, RestartStartsAFreshServerOnTheSamePort) {
  LocalClusterOptions o;
  o.bin_dir = testing::BinDir();
  o.servers = 2;
  o.fault_injection = true;
  auto c = LocalCluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status();
  LocalCluster& cluster = **c;
  const pid_t before = cluster.pid(1);
  const fabric::Endpoint endpoint = cluster.endpoints()[1];
  ASSERT_TRUE(cluster.Stop(1).ok());  // A stopped server is restarted too.
  const Status restarted = cluster.Restart(1);
  ASSERT_TRUE(restarted.ok()) << restarted;
  EXPECT_TRUE(cluster.Running(1));
  EXPECT_NE(cluster.pid(1), before);
  EXPECT_EQ(cluster.endpoints()[1].ToString(), endpoint.ToString());
  // The fresh process answers on the old port.
  const Status answered = cluster.Fault(1, {"clear"});
  EXPECT_TRUE(answered.ok()) << answered;
  EXPECT_FALSE(cluster.Restart(5).ok());
}

TEST(LocalClusterTest, RejectsBadOptions) {
  LocalClusterOptions o;
  EXPECT_FALSE(LocalCluster::Start(o).ok());  // No bin_dir.
  o.bin_dir = "/nonexistent";
  EXPECT_FALSE(LocalCluster::Start(o).ok());
  o.bin_dir = testing::BinDir();
  o.servers = 0;
  EXPECT_FALSE(LocalCluster::Start(o).ok());
}

}  // namespace
}  // namespace tessera::client
