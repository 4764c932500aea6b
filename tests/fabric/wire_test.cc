#include "fabric/wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <variant>

namespace tessera::fabric {
namespace {

// Round-trips every payload through BuildFrame + ParseFrame and checks the bytes re-encode
// identically.
template <typename T>
T RoundTrip(Op op, bool response, const T& body, std::span<const uint8_t> data = {}) {
  FrameHeader h{op, response, 77};
  std::vector<uint8_t> frame = BuildFrame(h, body, data);
  auto f = ParseFrame(frame, response ? Direction::kResponse : Direction::kRequest);
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return T{};
  EXPECT_EQ(f->header.request_id, 77u);
  EXPECT_EQ(f->frame_size, frame.size());
  EXPECT_EQ(f->data.size(), data.size());
  T out = std::get<T>(f->body);
  std::vector<uint8_t> again = BuildFrame(h, out, f->data);
  EXPECT_EQ(again, frame);
  return out;
}

TEST(WireTest, HeaderLayoutIsLittleEndianTsra) {
  uint8_t b[kHeaderSize];
  EncodeHeader(FrameHeader{Op::kRead, true, 0x0102030405060708ull, StatusCode::kNotFound, 9}, b);
  EXPECT_EQ(std::memcmp(b, "TSRA", 4), 0);
  EXPECT_EQ(b[4], 1);
  EXPECT_EQ(b[5], 0);
  EXPECT_EQ(b[6], 5);
  EXPECT_EQ(b[7], 0x80);
  EXPECT_EQ(b[8], 0x08);
  EXPECT_EQ(b[15], 0x01);
  EXPECT_EQ(b[16], static_cast<uint8_t>(StatusCode::kNotFound));
  EXPECT_EQ(b[20], 9);
}

TEST(WireTest, EveryPayloadRoundTrips) {
  HelloRequest hello;
  hello.client_nonce.fill(0xab);
  hello.client_id = 12345;
  EXPECT_EQ(RoundTrip(Op::kHello, false, hello).client_id, 12345u);

  ChallengeResponse ch;
  ch.server_nonce.fill(3);
  ch.server_id = 99;
  EXPECT_EQ(RoundTrip(Op::kHello, true, ch).server_id, 99u);

  AuthRequest auth;
  auth.client_mac.fill(7);
  EXPECT_EQ(RoundTrip(Op::kAuth, false, auth).client_mac, auth.client_mac);

  AuthOkResponse ok;
  ok.server_mac.fill(9);
  ok.slab_size = 1 << 20;
  ok.capacity_bytes = 1ull << 32;
  ok.flags = AuthOkResponse::kRdmaOffered;
  ok.rdma_port = 7471;
  ok.rdma_host = "10.0.0.7";
  ok.rdma_token = 555;
  AuthOkResponse ok2 = RoundTrip(Op::kAuth, true, ok);
  EXPECT_EQ(ok2.rdma_host, "10.0.0.7");
  EXPECT_EQ(ok2.rdma_port, 7471);
  EXPECT_EQ(ok2.rdma_token, 555u);

  EXPECT_EQ(RoundTrip(Op::kAllocSlab, false, AllocSlabRequest{4096}).size_hint, 4096u);
  AllocSlabResponse ar{5, 1 << 20, 0x7f0000000000ull, 0x1234};
  EXPECT_EQ(RoundTrip(Op::kAllocSlab, true, ar).rkey, 0x1234u);
  EXPECT_EQ(RoundTrip(Op::kFreeSlab, false, FreeSlabRequest{5}).slab_id, 5u);
  EXPECT_EQ(RoundTrip(Op::kRead, false, ReadRequest{5, 4096, 512}).length, 512u);

  std::vector<uint8_t> data(4096, 0x5a);
  WriteRequest w{5, 8192, 4096};
  EXPECT_EQ(RoundTrip(Op::kWrite, false, w, data).offset, 8192u);

  HeartbeatResponse hb{1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(RoundTrip(Op::kHeartbeat, true, hb).connections, 7u);
  std::vector<uint8_t> args = {1, 2, 3};
  EXPECT_EQ(RoundTrip(Op::kInvoke, false, InvokeRequest{42}, args).function_id, 42u);
  FaultRequest fr;
  fr.action = FaultAction::kDelay;
  fr.delay_us = 100;
  fr.op_mask = 1u << static_cast<int>(Op::kRead);
  EXPECT_EQ(RoundTrip(Op::kFault, false, fr).delay_us, 100u);
  Notice n{NoticeKind::kSlabEvicting, 5, 1000};
  FrameHeader nh{Op::kNotice, true, 0};
  auto nf = ParseFrame(BuildFrame(nh, n), Direction::kResponse);
  ASSERT_TRUE(nf.ok()) << nf.status();
  EXPECT_EQ(std::get<Notice>(nf->body).slab_id, 5u);
}

TEST(WireTest, RawPayloadFramesParse) {
  std::string text = "slabs 3\n";
  auto stats = BuildRawFrame(FrameHeader{Op::kStats, true, 4},
                             {reinterpret_cast<const uint8_t*>(text.data()), text.size()});
  auto f = ParseFrame(stats, Direction::kResponse);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(std::string(f->data.begin(), f->data.end()), text);
  auto err = BuildRawFrame(FrameHeader{Op::kRead, true, 4, StatusCode::kOutOfRange},
                           {reinterpret_cast<const uint8_t*>("bad"), 3});
  f = ParseFrame(err, Direction::kResponse);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->header.status, StatusCode::kOutOfRange);
  EXPECT_TRUE(ParseFrame(BuildRawFrame(FrameHeader{Op::kGoodbye, false, 1}), Direction::kRequest).ok());
}

// Parses `frame` and expects a ProtocolError whose message contains `needle`.
void ExpectRejected(std::vector<uint8_t> frame, Direction d, const std::string& needle) {
  auto f = ParseFrame(frame, d);
  ASSERT_FALSE(f.ok()) << "accepted a frame that should fail with '" << needle << "'";
  EXPECT_EQ(f.status().code(), StatusCode::kProtocolError) << f.status();
  EXPECT_NE(f.status().message().find(needle), std::string::npos) << f.status();
}

std::vector<uint8_t> ReadFrame() { return BuildFrame(FrameHeader{Op::kRead, false, 1}, ReadRequest{1, 0, 512}); }

TEST(WireTest, RejectsEveryMalformedHeaderField) {
  auto f = ReadFrame();
  f[0] = 'X';
  ExpectRejected(f, Direction::kRequest, "magic");
  f = ReadFrame();
  f[4] = 2;
  ExpectRejected(f, Direction::kRequest, "version");
  f = ReadFrame();
  f[6] = 0;
  ExpectRejected(f, Direction::kRequest, "unknown op");
  f = ReadFrame();
  f[6] = 15;  // Unassigned.
  ExpectRejected(f, Direction::kRequest, "unknown op");
  f = ReadFrame();
  f[6] = 0;
  f[7] = 1;  // 256: above the service ops.
  ExpectRejected(f, Direction::kRequest, "unknown op");
  f = ReadFrame();
  ExpectRejected(f, Direction::kResponse, "request where a response");
  f = ReadFrame();
  f[7] = 0x80;
  ExpectRejected(f, Direction::kRequest, "response where a request");
  f = ReadFrame();
  f[16] = 3;
  ExpectRejected(f, Direction::kRequest, "non-zero status");
  f = ReadFrame();
  f[7] = 0x80;
  f[16] = 200;
  ExpectRejected(f, Direction::kResponse, "unknown status");
  f = ReadFrame();
  PutU32(f.data() + 20, kMaxPayloadLength + 1);
  ExpectRejected(f, Direction::kRequest, "exceeds");
  f = ReadFrame();
  PutU32(f.data() + 20, 23);
  ExpectRejected(f, Direction::kRequest, "must be 24 bytes");
  // NOTICE as a request, with a request id, with a status.
  auto n = BuildFrame(FrameHeader{Op::kNotice, false, 0}, Notice{NoticeKind::kShuttingDown, 0, 0});
  ExpectRejected(n, Direction::kRequest, "not valid as a request");
  n = BuildFrame(FrameHeader{Op::kNotice, true, 5}, Notice{NoticeKind::kShuttingDown, 0, 0});
  ExpectRejected(n, Direction::kResponse, "request_id");
  // Error response with an over-long message.
  std::vector<uint8_t> msg(kMaxErrorMessageLength + 1, 'x');
  ExpectRejected(BuildRawFrame(FrameHeader{Op::kRead, true, 1, StatusCode::kInternal}, msg),
                 Direction::kResponse, "message");
  // Truncated header / payload are "need more", not errors.
  auto whole = ReadFrame();
  EXPECT_EQ(ParseFrame(std::span(whole).first(10), Direction::kRequest).status().code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(ParseFrame(std::span(whole).first(30), Direction::kRequest).status().code(),
            StatusCode::kUnavailable);
}

TEST(WireTest, RejectsEveryMalformedPayloadField) {
  // READ: slab 0, zero length, too long, overflow, padding.
  ExpectRejected(BuildFrame(FrameHeader{Op::kRead, false, 1}, ReadRequest{0, 0, 512}),
                 Direction::kRequest, "slab_id");
  ExpectRejected(BuildFrame(FrameHeader{Op::kRead, false, 1}, ReadRequest{1, 0, 0}),
                 Direction::kRequest, "length");
  ExpectRejected(BuildFrame(FrameHeader{Op::kRead, false, 1}, ReadRequest{1, 0, kMaxDataLength + 1}),
                 Direction::kRequest, "length");
  ExpectRejected(BuildFrame(FrameHeader{Op::kRead, false, 1}, ReadRequest{1, UINT64_MAX - 10, 512}),
                 Direction::kRequest, "overflows");
  auto f = ReadFrame();
  f[kHeaderSize + 21] = 1;
  ExpectRejected(f, Direction::kRequest, "padding");
  // WRITE whose length disagrees with the data that follows.
  std::vector<uint8_t> data(100, 1);
  ExpectRejected(BuildFrame(FrameHeader{Op::kWrite, false, 1}, WriteRequest{1, 0, 99}, data),
                 Direction::kRequest, "data bytes follow");
  ExpectRejected(BuildFrame(FrameHeader{Op::kWrite, false, 1}, WriteRequest{1, 0, 100}),
                 Direction::kRequest, "payload_len");
  // HELLO: client id 0, inverted version range.
  HelloRequest hello;
  hello.client_id = 0;
  ExpectRejected(BuildFrame(FrameHeader{Op::kHello, false, 1}, hello), Direction::kRequest, "client_id");
  hello.client_id = 1;
  hello.min_version = 3;
  hello.max_version = 2;
  ExpectRejected(BuildFrame(FrameHeader{Op::kHello, false, 1}, hello), Direction::kRequest, "version range");
  // CHALLENGE: server id 0, wrong version.
  ChallengeResponse ch;
  ExpectRejected(BuildFrame(FrameHeader{Op::kHello, true, 1}, ch), Direction::kResponse, "server_id");
  ch.server_id = 1;
  ch.version = 9;
  ExpectRejected(BuildFrame(FrameHeader{Op::kHello, true, 1}, ch), Direction::kResponse, "version");
  // AUTH_OK: unknown flags, RDMA offered without host, RDMA fields without the flag, bad host.
  AuthOkResponse ok;
  ok.flags = 2;
  ExpectRejected(BuildFrame(FrameHeader{Op::kAuth, true, 1}, ok), Direction::kResponse, "flags");
  ok.flags = AuthOkResponse::kRdmaOffered;
  ExpectRejected(BuildFrame(FrameHeader{Op::kAuth, true, 1}, ok), Direction::kResponse, "without a host");
  ok.flags = 0;
  ok.rdma_port = 5;
  ExpectRejected(BuildFrame(FrameHeader{Op::kAuth, true, 1}, ok), Direction::kResponse, "not offered");
  ok.rdma_port = 0;
  auto okf = BuildFrame(FrameHeader{Op::kAuth, true, 1}, ok);
  okf[kHeaderSize + 64] = 0x01;
  ExpectRejected(okf, Direction::kResponse, "non-printable");
  okf = BuildFrame(FrameHeader{Op::kAuth, true, 1}, ok);
  okf[kHeaderSize + 100] = 'a';  // A byte after the terminating NUL.
  ExpectRejected(okf, Direction::kResponse, "padding");
  // ALLOC_SLAB response: zero id, zero size, overflow, padding.
  ExpectRejected(BuildFrame(FrameHeader{Op::kAllocSlab, true, 1}, AllocSlabResponse{0, 1, 0, 0}),
                 Direction::kResponse, "slab_id");
  ExpectRejected(BuildFrame(FrameHeader{Op::kAllocSlab, true, 1}, AllocSlabResponse{1, 0, 0, 0}),
                 Direction::kResponse, "size");
  ExpectRejected(BuildFrame(FrameHeader{Op::kAllocSlab, true, 1}, AllocSlabResponse{1, 16, UINT64_MAX - 2, 0}),
                 Direction::kResponse, "overflows");
  ExpectRejected(BuildFrame(FrameHeader{Op::kFreeSlab, false, 1}, FreeSlabRequest{0}),
                 Direction::kRequest, "slab_id");
  // HEARTBEAT: free > total, load > 1000.
  ExpectRejected(BuildFrame(FrameHeader{Op::kHeartbeat, true, 1}, HeartbeatResponse{0, 5, 4}),
                 Direction::kResponse, "free_bytes");
  ExpectRejected(BuildFrame(FrameHeader{Op::kHeartbeat, true, 1}, HeartbeatResponse{0, 1, 4, 0, 0, 1001}),
                 Direction::kResponse, "load_permille");
  // INVOKE padding.
  auto inv = BuildFrame(FrameHeader{Op::kInvoke, false, 1}, InvokeRequest{1});
  inv[kHeaderSize + 5] = 1;
  ExpectRejected(inv, Direction::kRequest, "padding");
  // FAULT: unknown action, unknown op bits, delay without duration, absurd delay.
  FaultRequest fr;
  auto ff = BuildFrame(FrameHeader{Op::kFault, false, 1}, fr);
  PutU32(ff.data() + kHeaderSize, 99);
  ExpectRejected(ff, Direction::kRequest, "unknown action");
  fr.op_mask = 1u << 20;
  ExpectRejected(BuildFrame(FrameHeader{Op::kFault, false, 1}, fr), Direction::kRequest, "op_mask");
  fr.op_mask = 0;
  fr.action = FaultAction::kDelay;
  ExpectRejected(BuildFrame(FrameHeader{Op::kFault, false, 1}, fr), Direction::kRequest, "delay_us > 0");
  fr.delay_us = 4000ull * 1000000;
  ExpectRejected(BuildFrame(FrameHeader{Op::kFault, false, 1}, fr), Direction::kRequest, "one hour");
  // NOTICE: unknown kind, eviction without slab, shutdown with slab.
  auto nf = BuildFrame(FrameHeader{Op::kNotice, true, 0}, Notice{NoticeKind::kShuttingDown, 0, 0});
  PutU32(nf.data() + kHeaderSize, 9);
  ExpectRejected(nf, Direction::kResponse, "unknown kind");
  ExpectRejected(BuildFrame(FrameHeader{Op::kNotice, true, 0}, Notice{NoticeKind::kSlabEvicting, 0, 5}),
                 Direction::kResponse, "without a slab_id");
  ExpectRejected(BuildFrame(FrameHeader{Op::kNotice, true, 0}, Notice{NoticeKind::kShuttingDown, 3, 5}),
                 Direction::kResponse, "with a slab_id");
  // Fixed-size ops with wrong sizes.
  ExpectRejected(BuildRawFrame(FrameHeader{Op::kStats, false, 1}, data), Direction::kRequest, "must be 0");
  ExpectRejected(BuildRawFrame(FrameHeader{Op::kAuth, false, 1}, data), Direction::kRequest, "must be 32");
}

// READV/WRITEV: the fixed part, the ranges, then (WRITEV) the data; every field is validated.
std::vector<uint8_t> Ranges(std::initializer_list<VectorRange> ranges,
                            std::span<const uint8_t> data = {}) {
  std::vector<uint8_t> out(ranges.size() * VectorRange::kWireSize);
  size_t i = 0;
  for (const VectorRange& r : ranges) r.EncodeTo(out.data() + VectorRange::kWireSize * i++);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

TEST(WireTest, VectoredOpsRoundTrip) {
  auto ranges = Ranges({{1, 0, 512}, {7, 4096, 100}, {1, 512, 8}});
  VectorRequest rv = RoundTrip(Op::kReadV, false, VectorRequest{3, 620}, ranges);
  EXPECT_EQ(rv.count, 3u);
  EXPECT_EQ(rv.total_length, 620u);
  const std::vector<uint8_t> frame =
      BuildFrame(FrameHeader{Op::kReadV, false, 5}, VectorRequest{3, 620}, ranges);
  auto f = ParseFrame(frame, Direction::kRequest);  // f->data views `frame`.
  ASSERT_TRUE(f.ok()) << f.status();
  VectorRange r1 = VectorRangeAt(f->data, 1);
  EXPECT_EQ(r1.slab_id, 7u);
  EXPECT_EQ(r1.offset, 4096u);
  EXPECT_EQ(r1.length, 100u);
  std::vector<uint8_t> data(620, 0xab);
  auto wranges = Ranges({{1, 0, 512}, {7, 4096, 100}, {1, 512, 8}}, data);
  RoundTrip(Op::kWriteV, false, VectorRequest{3, 620}, wranges);
  // Responses: READV carries the data, WRITEV nothing.
  const std::vector<uint8_t> resp_frame = BuildRawFrame(FrameHeader{Op::kReadV, true, 5}, data);
  auto resp = ParseFrame(resp_frame, Direction::kResponse);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->data.size(), 620u);
  EXPECT_TRUE(ParseFrame(BuildRawFrame(FrameHeader{Op::kWriteV, true, 5}), Direction::kResponse).ok());
  ExpectRejected(BuildRawFrame(FrameHeader{Op::kWriteV, true, 5}, data), Direction::kResponse,
                 "must be 0");
  ExpectRejected(BuildRawFrame(FrameHeader{Op::kReadV, true, 5}), Direction::kResponse, "");
  EXPECT_EQ(OpName(Op::kReadV), "READV");
  EXPECT_EQ(OpName(Op::kWriteV), "WRITEV");
}

TEST(WireTest, RejectsEveryMalformedVectorField) {
  auto one = Ranges({{1, 0, 512}});
  // count 0, count beyond the limit, total 0, total beyond the limit.
  ExpectRejected(BuildFrame(FrameHeader{Op::kReadV, false, 1}, VectorRequest{0, 512}, one),
                 Direction::kRequest, "count");
  std::vector<uint8_t> many((kMaxVectorRanges + 1) * VectorRange::kWireSize);
  for (uint32_t i = 0; i <= kMaxVectorRanges; ++i) {
    VectorRange{1, 0, 1}.EncodeTo(many.data() + i * VectorRange::kWireSize);
  }
  ExpectRejected(BuildFrame(FrameHeader{Op::kReadV, false, 1},
                            VectorRequest{kMaxVectorRanges + 1, kMaxVectorRanges + 1}, many),
                 Direction::kRequest, "");
  ExpectRejected(BuildFrame(FrameHeader{Op::kReadV, false, 1}, VectorRequest{1, 0}, one),
                 Direction::kRequest, "length");
  // The ranges do not add up to total_length.
  ExpectRejected(BuildFrame(FrameHeader{Op::kReadV, false, 1}, VectorRequest{1, 511}, one),
                 Direction::kRequest, "add up");
  // Fewer range bytes than count says; trailing bytes after a READV's ranges.
  ExpectRejected(BuildFrame(FrameHeader{Op::kReadV, false, 1}, VectorRequest{2, 1024}, one),
                 Direction::kRequest, "ranges need");
  std::vector<uint8_t> trailing = one;
  trailing.push_back(0);
  ExpectRejected(BuildFrame(FrameHeader{Op::kReadV, false, 1}, VectorRequest{1, 512}, trailing),
                 Direction::kRequest, "");
  // A bad range: slab 0, zero length, overflowing offset, non-zero padding.
  ExpectRejected(BuildFrame(FrameHeader{Op::kReadV, false, 1}, VectorRequest{2, 1024},
                            Ranges({{1, 0, 512}, {0, 0, 512}})),
                 Direction::kRequest, "slab_id");
  ExpectRejected(BuildFrame(FrameHeader{Op::kReadV, false, 1}, VectorRequest{2, 512},
                            Ranges({{1, 0, 512}, {1, 0, 0}})),
                 Direction::kRequest, "length");
  ExpectRejected(BuildFrame(FrameHeader{Op::kReadV, false, 1}, VectorRequest{1, 512},
                            Ranges({{1, UINT64_MAX - 10, 512}})),
                 Direction::kRequest, "overflows");
  auto padded = Ranges({{1, 0, 512}});
  padded[21] = 1;
  ExpectRejected(BuildFrame(FrameHeader{Op::kReadV, false, 1}, VectorRequest{1, 512}, padded),
                 Direction::kRequest, "padding");
  // WRITEV: data shorter / longer than total_length; no data at all.
  std::vector<uint8_t> d511(511, 1), d513(513, 1);
  ExpectRejected(BuildFrame(FrameHeader{Op::kWriteV, false, 1}, VectorRequest{1, 512},
                            Ranges({{1, 0, 512}}, d511)),
                 Direction::kRequest, "data bytes expected");
  ExpectRejected(BuildFrame(FrameHeader{Op::kWriteV, false, 1}, VectorRequest{1, 512},
                            Ranges({{1, 0, 512}}, d513)),
                 Direction::kRequest, "data bytes expected");
  ExpectRejected(BuildFrame(FrameHeader{Op::kWriteV, false, 1}, VectorRequest{1, 512}, one),
                 Direction::kRequest, "");
}

TEST(WireTest, OpNames) {
  EXPECT_EQ(OpName(Op::kAllocSlab), "ALLOC_SLAB");
  EXPECT_EQ(OpName(static_cast<Op>(15)), "UNKNOWN(15)");
  EXPECT_FALSE(IsKnownOp(0));
  EXPECT_TRUE(IsKnownOp(kMaxOpValue));
  EXPECT_FALSE(IsKnownOp(kMaxOpValue + 1));
}


// Service ops: the engine checks only the size bound and hands the payload over whole; every op
// outside the service range and the base ops stays a protocol error.
TEST(WireTest, ServiceOpsCarryTheirPayloadWhole) {
  EXPECT_FALSE(IsKnownOp(kFirstServiceOp - 1)) << "15 is unassigned";
  EXPECT_TRUE(IsKnownOp(kFirstServiceOp));
  EXPECT_TRUE(IsKnownOp(kLastServiceOp));
  EXPECT_FALSE(IsKnownOp(kLastServiceOp + 1));
  EXPECT_TRUE(IsServiceOp(Op{40}));
  EXPECT_FALSE(IsServiceOp(Op::kRead));
  EXPECT_EQ(OpName(Op{40}), "SERVICE_OP(40)");
  EXPECT_EQ(OpName(Op{kLastServiceOp + 1}), "UNKNOWN(256)");

  const std::vector<uint8_t> payload = {1, 2, 3, 0, 0, 9};
  for (bool response : {false, true}) {
    auto frame = BuildRawFrame(FrameHeader{Op{40}, response, 5}, payload);
    auto f = ParseFrame(frame, response ? Direction::kResponse : Direction::kRequest);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_TRUE(std::holds_alternative<std::monostate>(f->body));
    EXPECT_EQ(std::vector<uint8_t>(f->data.begin(), f->data.end()), payload);
  }
  auto empty = ParseFrame(BuildRawFrame(FrameHeader{Op{16}, false, 5}), Direction::kRequest);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->data.empty());

  // Above the payload bound: refused from the header alone.
  uint8_t h[kHeaderSize];
  EncodeHeader(FrameHeader{Op{40}, false, 5, StatusCode::kOk, kMaxPayloadLength + 1}, h);
  auto big = DecodeHeader(h, Direction::kRequest);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("exceeds"), std::string::npos) << big.status();
  auto unknown = BuildRawFrame(FrameHeader{Op{kLastServiceOp + 1}, false, 5}, payload);
  ExpectRejected(unknown, Direction::kRequest, "");
}

}  // namespace
}  // namespace tessera::fabric
