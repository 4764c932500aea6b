// `tessera run` with a per-client credential (issue 15): a program's heap is paged to real
// memservers by a client that authenticates as itself with a token from `tessera token issue`
// (what a client on another host does), and a forged token is a clear failure.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "client/local_cluster.h"
#include "fabric/credential.h"
#include "tests/support/test_util.h"

namespace tessera {
namespace {

using testing::BinDir;
using testing::JsonInt;
using testing::ReadFile;
using testing::RunCommand;
using testing::TempDir;

std::vector<std::string> RunArgs(const client::LocalCluster& c, const std::string& token,
                                 const std::string& json) {
  return {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1", BinDir() + "/tessera", "run",
          "--local-memory", "6M", "--region", "1G", "--k", "2", "--r", "1", "--spares", "0",
          "--cluster", c.cluster_file_path(), "--auth-token-file", token, "--stats-json", json,
          "--", BinDir() + "/tessera-preload-probe", "mmap"};
}

TEST(RunCredentials, AClientTokenPagesAndAForgedOneIsRefused) {
  client::LocalClusterOptions lo;
  lo.bin_dir = BinDir();
  lo.servers = 3;
  lo.capacity = "128M";
  auto cluster = client::LocalCluster::Start(lo);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto token = (*cluster)->IssueCredentialFile("paged-job");
  ASSERT_TRUE(token.ok()) << token.status();

  TempDir tmp;
  const std::string json = tmp.path() + "/stats.json";
  auto out = RunCommand(RunArgs(**cluster, *token, json), 180000);
  ASSERT_EQ(out.exit_code, 0) << out.stdout_text;
  const std::string j = ReadFile(json);
  EXPECT_GT(JsonInt(j, "remote_writes"), 0) << "nothing went remote: " << j;
  EXPECT_GT(JsonInt(j, "remote_reads"), 0) << j;
  EXPECT_EQ(JsonInt(j, "fill_errors"), 0) << j;

  // The same token with its key changed: the servers refuse it, and tessera run says so.
  std::string text = ReadFile(*token);
  size_t k = text.find("key=") + 4;
  text[k] = text[k] == '0' ? '1' : '0';
  const std::string forged = tmp.path() + "/forged.credential";
  std::ofstream(forged) << text;
  out = RunCommand(RunArgs(**cluster, forged, tmp.path() + "/forged.json"), 60000);
  EXPECT_NE(out.exit_code, 0) << out.stdout_text;
  EXPECT_NE(out.stdout_text.find("authentication failed"), std::string::npos) << out.stdout_text;
}

}  // namespace
}  // namespace tessera
