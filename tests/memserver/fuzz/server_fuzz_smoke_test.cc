// A bounded CI run of the stateful server fuzz target (tests/memserver/fuzz/server_fuzzer.cc):
// seeds built here from the wire format (so they follow it), the checked-in corpus, then
// deterministic mutants (tests/support/fuzz_smoke.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/kayak/wire/wire.h"
#include "fabric/wire.h"
#include "tests/support/fuzz_smoke.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
void ShutdownServerFuzzHarness();

namespace tessera::fabric {
namespace {

using kayak::wire::kAnyVersion;
using kayak::wire::KvDeleteRequest;
using kayak::wire::KvInvokeRequest;
using kayak::wire::KvKeyRequest;
using kayak::wire::KvPutRequest;

void Append(std::vector<uint8_t>& out, const std::vector<uint8_t>& frame) {
  out.insert(out.end(), frame.begin(), frame.end());
}

std::vector<uint8_t> Prefix(std::vector<uint8_t> v, size_t n) {
  v.resize(std::min(v.size(), n));
  return v;
}

// mode, cut seed, then the frames.
std::vector<uint8_t> Seed(uint8_t mode, uint8_t cut,
                          const std::vector<std::vector<uint8_t>>& frames) {
  std::vector<uint8_t> s{mode, cut};
  for (const auto& f : frames) Append(s, f);
  return s;
}

std::vector<std::vector<uint8_t>> Seeds() {
  // Slab ids of the daemon's pool (4 MiB of 64 KiB slabs): generation 1 of the first indexes;
  // the mutator varies them.
  const uint64_t slab = 1;
  std::vector<uint8_t> kv_key = {'k', 'e', 'y'};
  std::vector<uint8_t> put_data = {'k', 'e', 'y', 'v', 'a', 'l'};
  std::vector<uint8_t> page(4096, 0xab);
  std::vector<uint8_t> ranges;
  for (int i = 0; i < 2; ++i) {
    std::vector<uint8_t> r(VectorRange::kWireSize);
    VectorRange{slab, uint64_t(i) * 512, 512}.EncodeTo(r.data());
    ranges.insert(ranges.end(), r.begin(), r.end());
  }
  std::vector<uint8_t> writev = ranges;
  writev.insert(writev.end(), 1024, 0x5c);
  std::vector<uint8_t> args = {1, 2, 3, 4};
  HelloRequest hello;
  hello.client_id = 99;
  std::vector<uint8_t> instance(8, 0);
  instance[0] = 7;
  return {
      // Unauthenticated: a HELLO, a HELLO with an instance id, an op before AUTH, garbage.
      Seed(0, 3, {BuildFrame(FrameHeader{Op::kHello, false, 1}, hello)}),
      Seed(0, 9,
           {BuildFrame(FrameHeader{Op::kHello, false, 1}, hello, instance),
            BuildFrame(FrameHeader{Op::kAuth, false, 2}, AuthRequest{})}),
      Seed(0, 1, {BuildFrame(FrameHeader{Op::kRead, false, 5}, ReadRequest{slab, 0, 512})}),
      Seed(0, 200, {std::vector<uint8_t>(100, 0x41)}),
      // Authenticated: slabs, data, vectors, control, KV, offload, goodbye.
      Seed(1, 5,
           {BuildFrame(FrameHeader{Op::kAllocSlab, false, 10}, AllocSlabRequest{}),
            BuildFrame(FrameHeader{Op::kWrite, false, 11}, WriteRequest{slab, 0, 4096}, page),
            BuildFrame(FrameHeader{Op::kRead, false, 12}, ReadRequest{slab, 0, 4096}),
            BuildFrame(FrameHeader{Op::kWriteV, false, 13}, VectorRequest{2, 1024}, writev),
            BuildFrame(FrameHeader{Op::kReadV, false, 14}, VectorRequest{2, 1024}, ranges),
            BuildFrame(FrameHeader{Op::kFreeSlab, false, 15}, FreeSlabRequest{slab}),
            BuildRawFrame(FrameHeader{Op::kStats, false, 16}),
            BuildRawFrame(FrameHeader{Op::kHeartbeat, false, 17}),
            BuildRawFrame(FrameHeader{Op::kGoodbye, false, 18})}),
      Seed(3, 77,
           {BuildFrame(FrameHeader{kayak::wire::kKvPut, false, 20}, KvPutRequest{1, 3, kAnyVersion, 3},
                       put_data),
            BuildFrame(FrameHeader{kayak::wire::kKvGet, false, 21}, KvKeyRequest{1, 3}, kv_key),
            BuildFrame(FrameHeader{kayak::wire::kKvDelete, false, 22}, KvDeleteRequest{1, 3, kAnyVersion},
                       kv_key),
            BuildFrame(FrameHeader{kayak::wire::kKvInvoke, false, 23}, KvInvokeRequest{1, 1, 0}, args),
            BuildFrame(FrameHeader{Op::kInvoke, false, 24}, InvokeRequest{1}, args),
            BuildFrame(FrameHeader{Op::kFault, false, 25}, FaultRequest{}),
            // A service op no service registered: an error reply, the connection goes on.
            BuildRawFrame(FrameHeader{Op{kLastServiceOp}, false, 26}, args)}),
      // A WRITE cut short: its header and 200 bytes of its payload.
      Seed(
          1, 2,
          {Prefix(BuildFrame(FrameHeader{Op::kWrite, false, 30}, WriteRequest{slab, 0, 4096}, page),
                  200)}),
  };
}

TEST(ServerFuzzSmokeTest, SeedsCorpusAndMutantsKeepTheServerServing) {
  const auto seeds = Seeds();
  auto r = tessera::testing::RunFuzzSmoke(&LLVMFuzzerTestOneInput, seeds, TESSERA_FUZZ_CORPUS_DIR,
                                          20000, 10.0);
  EXPECT_GE(r.runs, seeds.size());
  std::printf("fuzz smoke: %zu inputs (%zu corpus files)\n", r.runs, r.corpus_files);
  ShutdownServerFuzzHarness();
}

}  // namespace
}  // namespace tessera::fabric
