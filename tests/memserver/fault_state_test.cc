#include "memserver/fault_state.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tessera::memserver {
namespace {

constexpr uint64_t kSec = 1000000000ull;

Result<FaultSpec> Parse(std::vector<std::string> words, std::string ops = "",
                        std::string duration = "") {
  return ParseFaultCommand(words, ops, duration);
}

TEST(FaultParseTest, ParsesEveryAction) {
  EXPECT_EQ(Parse({"clear"})->kind, FaultKind::kClear);
  auto d = Parse({"delay", "200us"});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->kind, FaultKind::kDelay);
  EXPECT_EQ(d->delay_ns, 200000u);
  EXPECT_EQ(Parse({"hang"})->kind, FaultKind::kHang);
  EXPECT_EQ(Parse({"drop"})->kind, FaultKind::kDrop);
  EXPECT_EQ(Parse({"crash"})->kind, FaultKind::kCrash);
  auto b = Parse({"bitflip", "3", "4294967296"});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->count, 3u);
  EXPECT_EQ(b->slab_id, 4294967296u);
  EXPECT_EQ(Parse({"bitflip", "3"})->slab_id, 0u);
  EXPECT_EQ(Parse({"refuse-alloc"})->kind, FaultKind::kRefuseAlloc);
  EXPECT_EQ(Parse({"evict", "2"})->count, 2u);
  auto o = Parse({"hang"}, "alloc,stats", "5s");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->op_mask, (1u << op_bits::kAllocSlab) | (1u << op_bits::kStats));
  EXPECT_EQ(o->duration_ns, 5 * kSec);
}

TEST(FaultParseTest, RejectsBadCommands) {
  EXPECT_FALSE(Parse({}).ok());
  EXPECT_FALSE(Parse({"explode"}).ok());
  EXPECT_FALSE(Parse({"delay"}).ok());
  EXPECT_FALSE(Parse({"delay", "200"}).ok());        // Unit required.
  EXPECT_FALSE(Parse({"delay", "120s"}).ok());       // Capped.
  EXPECT_FALSE(Parse({"hang", "extra"}).ok());
  EXPECT_FALSE(Parse({"bitflip"}).ok());
  EXPECT_FALSE(Parse({"bitflip", "0"}).ok());
  EXPECT_FALSE(Parse({"bitflip", "-1"}).ok());
  EXPECT_FALSE(Parse({"bitflip", "2", "0"}).ok());
  EXPECT_FALSE(Parse({"bitflip", "2", "x"}).ok());
  EXPECT_FALSE(Parse({"evict", "0"}).ok());
  EXPECT_FALSE(Parse({"hang"}, "read,bogus").ok());
  EXPECT_FALSE(Parse({"crash"}, "read").ok());       // --ops makes no sense for crash.
  EXPECT_FALSE(Parse({"crash"}, "", "1s").ok());
  EXPECT_FALSE(Parse({"hang"}, "", "soon").ok());
  EXPECT_NE(Parse({"explode"}).status().message().find("explode"), std::string::npos);
}

TEST(FaultStateTest, NothingActiveByDefault) {
  FaultState f;
  auto d = f.Decide(op_bits::kRead, 0);
  EXPECT_EQ(d.delay_ns, 0u);
  EXPECT_FALSE(d.hang);
  EXPECT_FALSE(d.drop);
  EXPECT_FALSE(f.RefuseAlloc(0));
  EXPECT_EQ(f.Describe(0), "none");
}

TEST(FaultStateTest, DelayAppliesToChosenOpsUntilCleared) {
  FaultState f;
  ASSERT_TRUE(f.Apply(*Parse({"delay", "200us"}), 0).ok());
  EXPECT_EQ(f.Decide(op_bits::kRead, 1).delay_ns, 200000u);
  EXPECT_EQ(f.Decide(op_bits::kWrite, 1).delay_ns, 200000u);
  EXPECT_EQ(f.Decide(op_bits::kAllocSlab, 1).delay_ns, 0u);  // Default mask: READ|WRITE.
  EXPECT_EQ(f.Decide(op_bits::kFault, 1).delay_ns, 0u);
  EXPECT_NE(f.Describe(1).find("delay=200us"), std::string::npos);
  ASSERT_TRUE(f.Apply(*Parse({"clear"}), 2).ok());
  EXPECT_EQ(f.Decide(op_bits::kRead, 3).delay_ns, 0u);
}

TEST(FaultStateTest, HangDropAndRefuseExpireAfterTheirDuration) {
  FaultState f;
  ASSERT_TRUE(f.Apply(*Parse({"hang"}, "stats", "1s"), 10 * kSec).ok());
  ASSERT_TRUE(f.Apply(*Parse({"drop"}, "heartbeat"), 10 * kSec).ok());
  ASSERT_TRUE(f.Apply(*Parse({"refuse-alloc"}, "", "2s"), 10 * kSec).ok());
  EXPECT_TRUE(f.Decide(op_bits::kStats, 10 * kSec).hang);
  EXPECT_FALSE(f.Decide(op_bits::kRead, 10 * kSec).hang);
  EXPECT_TRUE(f.Decide(op_bits::kHeartbeat, 10 * kSec).drop);
  EXPECT_TRUE(f.RefuseAlloc(11 * kSec));
  EXPECT_FALSE(f.Decide(op_bits::kStats, 11 * kSec).hang);  // Expired.
  EXPECT_FALSE(f.RefuseAlloc(12 * kSec));
  EXPECT_TRUE(f.Decide(op_bits::kHeartbeat, 100 * kSec).drop);  // Until cleared.
}

TEST(FaultStateTest, OneShotKindsAreNotStates) {
  FaultState f;
  EXPECT_FALSE(f.Apply(*Parse({"crash"}), 0).ok());
  EXPECT_FALSE(f.Apply(*Parse({"bitflip", "1"}), 0).ok());
  FaultSpec bad;
  bad.kind = FaultKind::kHang;
  bad.op_mask = 1u << op_bits::kFault;
  EXPECT_FALSE(f.Apply(bad, 0).ok());
}

TEST(FaultSpecCodecTest, RoundTripsAndRejectsJunk) {
  FaultSpec s = *Parse({"bitflip", "7", "12345"});
  std::string wire = EncodeFaultSpec(s);
  ASSERT_EQ(wire.size(), kFaultSpecWireSize);
  auto back = DecodeFaultSpec(wire);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kind, FaultKind::kBitFlip);
  EXPECT_EQ(back->count, 7u);
  EXPECT_EQ(back->slab_id, 12345u);
  EXPECT_FALSE(DecodeFaultSpec(wire.substr(1)).ok());
  std::string bad_kind = wire;
  bad_kind[0] = 99;
  EXPECT_FALSE(DecodeFaultSpec(bad_kind).ok());
  std::string zero_count = EncodeFaultSpec(FaultSpec{FaultKind::kBitFlip});
  EXPECT_FALSE(DecodeFaultSpec(zero_count).ok());
}

}  // namespace
}  // namespace tessera::memserver
