// Bounded CI runs of one parser fuzz target (credential or cluster file; the build picks which
// source provides LLVMFuzzerTestOneInput, and names the suite): seeds, the checked-in corpus directory, then
// deterministic mutants (tests/support/fuzz_smoke.h).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fabric/credential.h"
#include "tests/support/fuzz_smoke.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

TEST(TESSERA_FUZZ_SUITE, SeedsCorpusAndMutantsNeverCrash) {
  using namespace tessera::fabric;
  auto client = IssueCredential("a-cluster-secret-of-enough-length", "alice", Role::kClient);
  auto admin = IssueCredential("a-cluster-secret-of-enough-length", "ops@site", Role::kAdmin);
  ASSERT_TRUE(client.ok() && admin.ok());
  const std::vector<std::vector<uint8_t>> seeds = {
      Bytes(FormatCredential(*client)),
      Bytes(FormatCredential(*admin)),
      Bytes(
          "# cluster\n10.0.0.1:7700 rack=r1\n10.0.0.2:7700   # no rack\n[fe80::1]:7700 rack=r2\n"),
      Bytes("127.0.0.1:1\n\n  127.0.0.1:65535 rack=a.b-c_d\n"),
      Bytes("host.example:7700 rack=\n127.0.0.1:0\n[::1]:99999\n"),
      Bytes("# issued\ntessera-credential v1 role=client name=alice id=1 key=" +
            std::string(64, 'a') + "\n"),
      Bytes("tessera-credential v1 role=admin name=ops id=2 key=" + std::string(64, '0') +
            " extra=1\n"),
      Bytes("a-cluster-secret-of-enough-length\n\n"),
      Bytes("short\n"),
  };
  auto r = tessera::testing::RunFuzzSmoke(&LLVMFuzzerTestOneInput, seeds, TESSERA_FUZZ_CORPUS_DIR,
                                          200000, 3.0);
  EXPECT_GE(r.runs, seeds.size());
  std::printf("fuzz smoke: %zu inputs (%zu corpus files)\n", r.runs, r.corpus_files);
}

}  // namespace
