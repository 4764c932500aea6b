#include "apps/paramsvc/wire/wire.h"

#include <gtest/gtest.h>

#include <random>

#include "apps/paramsvc/client/client.h"
#include "apps/paramsvc/server/server.h"

namespace tessera::paramsvc {
namespace {

JobSpec Spec() {
  JobSpec s;
  s.name = "job-a";
  s.workers = 4;
  s.mode = Mode::kBounded;
  s.staleness = 2;
  s.optimizer.lr = 0.5f;
  s.optimizer.momentum = 0.9f;
  s.partition_bytes = 8192;
  s.tensors = {{"w", DType::kF32, {100, 30}}, {"b", DType::kF16, {30}}};
  return s;
}

TEST(ParamsvcWire, HeaderRoundTripAndRejections) {
  uint8_t b[kHeaderSize];
  EncodeHeader({static_cast<uint8_t>(Op::kPush), 0, 123, 7, 99}, b);
  auto h = DecodeHeader(b);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->op, static_cast<uint8_t>(Op::kPush));
  EXPECT_EQ(h->payload_len, 123u);
  EXPECT_EQ(h->job, 7u);
  EXPECT_EQ(h->request_id, 99u);
  uint8_t bad[kHeaderSize];
  std::memcpy(bad, b, kHeaderSize);
  bad[0] ^= 1;
  EXPECT_EQ(DecodeHeader(bad).status().code(), StatusCode::kProtocolError);
  std::memcpy(bad, b, kHeaderSize);
  bad[4] = 2;
  EXPECT_NE(DecodeHeader(bad).status().message().find("version"), std::string::npos);
  std::memcpy(bad, b, kHeaderSize);
  bad[5] = 200;
  EXPECT_NE(DecodeHeader(bad).status().message().find("unknown op"), std::string::npos);
  std::memcpy(bad, b, kHeaderSize);
  EncodeFixed32(bad + 8, kMaxPayload + 1);
  EXPECT_NE(DecodeHeader(bad).status().message().find("exceeds"), std::string::npos);
}

TEST(ParamsvcWire, JobSpecRoundTripAndPartitioning) {
  const JobSpec s = Spec();
  auto d = JobSpec::Decode(s.Encode());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->SameModel(s));
  auto parts = PartitionModel(s);
  // 3000 fp32 elements in 2048-element partitions, then the 30-element bias.
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].count, 2048u);
  EXPECT_EQ(parts[1].offset, 2048u);
  EXPECT_EQ(parts[1].count, 952u);
  EXPECT_EQ(parts[2].tensor, 1u);
}

TEST(ParamsvcWire, BadSpecsGetClearErrors) {
  JobSpec s = Spec();
  s.tensors[0].shape = {};
  EXPECT_NE(s.Validate().message().find("0 dims"), std::string::npos) << s.Validate();
  s = Spec();
  s.tensors[0].shape = {3, 0};
  EXPECT_NE(s.Validate().message().find("dim of 0"), std::string::npos);
  s = Spec();
  s.workers = 0;
  EXPECT_NE(s.Validate().message().find("workers"), std::string::npos);
  s = Spec();
  s.partition_bytes = 100;
  EXPECT_NE(s.Validate().message().find("partition_bytes"), std::string::npos);
  s = Spec();
  s.optimizer.momentum = 1.5f;
  EXPECT_EQ(s.Validate().code(), StatusCode::kInvalidArgument);
  auto enc = Spec().Encode();
  enc[enc.size() - 10] = 9;  // The last tensor's dtype byte (1 dim).
  auto d = JobSpec::Decode(enc);
  EXPECT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("dtype"), std::string::npos) << d.status();
  enc = Spec().Encode();
  enc.push_back(0);
  EXPECT_NE(JobSpec::Decode(enc).status().message().find("trailing"), std::string::npos);
  EXPECT_FALSE(ParseMode("bounded(x)").ok());
  EXPECT_FALSE(ParseMode("eventual").ok());
  auto m = ParseMode("bounded(3)");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->second, 3u);
}

TEST(ParamsvcWire, PushAndPullValidation) {
  std::vector<uint8_t> b(PushRequest::kFixed + 8);
  PushRequest p;
  p.worker = 1;
  p.partition = 2;
  p.version = 5;
  p.dtype = DType::kF16;
  p.count = 4;
  p.EncodeFixed(b.data());
  auto d = PushRequest::Decode(b);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->data.size(), 8u);
  b.push_back(0);
  EXPECT_NE(PushRequest::Decode(b).status().message().find("expected 8"), std::string::npos);
  b.pop_back();
  b[16] = 7;
  EXPECT_NE(PushRequest::Decode(b).status().message().find("dtype"), std::string::npos);
  uint8_t pr[PullRequest::kWireSize];
  PullRequest q{1, DType::kF32, 3, 700000};
  q.EncodeTo(pr);
  EXPECT_NE(PullRequest::Decode(pr).status().message().find("timeout"), std::string::npos);
}

TEST(ParamsvcWire, JobSpecFromJson) {
  auto s = JobSpecFromJson(R"J({"name":"m","workers":2,"mode":"bounded(2)","lr":0.1,
    "momentum":0.9,"tensors":[{"name":"w","shape":[4,5]},{"name":"h","dtype":"bf16","shape":[3]}]})J");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->mode, Mode::kBounded);
  EXPECT_EQ(s->staleness, 2u);
  EXPECT_EQ(s->tensors[1].dtype, DType::kBF16);
  EXPECT_FALSE(JobSpecFromJson("{").ok());
  auto avg = JobSpecFromJson(R"({"name":"b","optimizer":"average","tensors":[{"name":"g","shape":[8]}]})");
  ASSERT_TRUE(avg.ok()) << avg.status();
  EXPECT_EQ(avg->optimizer.kind, OptimizerKind::kAverage);
  auto again = JobSpec::Decode(avg->Encode());  // The new kind crosses the wire.
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->optimizer.kind, OptimizerKind::kAverage);
  EXPECT_NE(JobSpecFromJson(R"({"name":"m","optimizer":"lamb","tensors":[{"name":"w","shape":[1]}]})")
                .status().message().find("lamb"), std::string::npos);
  EXPECT_NE(JobSpecFromJson(R"({"name":"m","tensors":[{"name":"w","dtype":"int8","shape":[1]}]})")
                .status().message().find("int8"), std::string::npos);
}

// Deterministic fuzzing: every decoder over mutated and truncated valid messages must return
// a value or an error, never crash or read out of bounds (ASan catches that in the sanitizer
// pass), and whatever it accepts must pass validation.
TEST(ParamsvcWire, FuzzDecodersWithMutatedMessages) {
  std::vector<std::vector<uint8_t>> seeds;
  seeds.push_back(Spec().Encode());
  JobLayout lay{3, PartitionModel(Spec())};
  seeds.push_back(lay.Encode());
  std::vector<uint8_t> push(PushRequest::kFixed + 16);
  PushRequest{0, 1, 2, DType::kF32, 4, {}}.EncodeFixed(push.data());
  seeds.push_back(push);
  PartitionState st;
  st.version = 4;
  st.param = {1, 2, 3};
  st.mom = {0, 0, 0};
  seeds.push_back(EncodePartitionState(st));
  std::mt19937 rng(12345);
  int accepted = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<uint8_t> m = seeds[iter % seeds.size()];
    const int kind = rng() % 3;
    if (kind == 0 && !m.empty()) {
      for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k) m[rng() % m.size()] = rng();
    } else if (kind == 1 && !m.empty()) {
      m.resize(rng() % m.size());
    } else {
      for (int k = 0; k < 1 + static_cast<int>(rng() % 8); ++k) m.push_back(rng());
    }
    switch (iter % seeds.size()) {
      case 0: {
        auto s = JobSpec::Decode(m);
        if (s.ok()) {
          ++accepted;
          ASSERT_TRUE(s->Validate().ok());
        } else {
          ASSERT_FALSE(s.status().message().empty());
        }
        break;
      }
      case 1: (void)JobLayout::Decode(m); break;
      case 2: {
        auto p = PushRequest::Decode(m);
        if (p.ok()) {
          ASSERT_EQ(p->data.size(), p->count * DTypeSize(p->dtype));
        }
        break;
      }
      case 3: (void)DecodePartitionState(m, 3); break;
    }
    uint8_t h[kHeaderSize] = {};
    for (auto& x : h) x = rng();
    if (rng() % 2) EncodeHeader({static_cast<uint8_t>(rng() % 14), 0, static_cast<uint32_t>(rng()), 0, 0}, h);
    auto hd = DecodeHeader(h);
    if (hd.ok()) {
      ASSERT_LE(hd->payload_len, MaxPayload(hd->op));
    }
  }
  EXPECT_GT(accepted, 0);  // Some mutations (e.g. of the name) stay valid.
}

}  // namespace
}  // namespace tessera::paramsvc
