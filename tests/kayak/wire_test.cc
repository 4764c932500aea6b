// Kayak's wire format (apps/kayak/wire/wire.h): every KV payload round-trips byte for byte,
// malformed ones are refused with the field named, and the bytes are those the KV frames always
// had (ops 16..21, the same layouts), so clients and servers of either side of the move agree.
#include "apps/kayak/wire/wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "apps/kayak/wire/key_hash.h"

namespace tessera::kayak::wire {
namespace {

using fabric::BuildRawFrame;
using fabric::FrameHeader;

// A KV payload to parse: the op, the direction, the bytes.
struct Frame {
  template <typename Body>
  Frame(Op o, bool resp, const Body& body, std::span<const uint8_t> data = {})
      : op(o), response(resp), payload(Payload(body, data)) {}
  Op op;
  bool response;
  std::vector<uint8_t> payload;
};

Result<ParsedKv> Parse(const Frame& f) {
  return f.response ? ParseResponse(f.op, f.payload) : ParseRequest(f.op, f.payload);
}

// Round-trips a payload through Payload + Parse* and checks the bytes re-encode identically.
template <typename T>
T RoundTrip(Op op, bool response, const T& body, std::span<const uint8_t> data = {}) {
  Frame frame(op, response, body, data);
  auto f = Parse(frame);
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return T{};
  EXPECT_EQ(f->op, op);
  EXPECT_EQ(f->data.size(), data.size());
  T out = std::get<T>(f->body);
  EXPECT_EQ(Payload(out, f->data), frame.payload);
  return out;
}

void ExpectRejected(const Frame& frame, const std::string& needle) {
  auto f = Parse(frame);
  ASSERT_FALSE(f.ok()) << "accepted a payload that should fail with '" << needle << "'";
  EXPECT_EQ(f.status().code(), StatusCode::kProtocolError) << f.status();
  EXPECT_NE(f.status().message().find(needle), std::string::npos) << f.status();
}

std::vector<uint8_t> Bytes(std::string_view s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::vector<uint8_t> Cat(std::vector<uint8_t> a, const std::vector<uint8_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(KayakWireTest, KvFramesRoundTrip) {
  EXPECT_TRUE(IsKvOp(Op{16}));
  EXPECT_TRUE(IsKvOp(Op{21}));
  EXPECT_FALSE(IsKvOp(Op{22}));
  EXPECT_FALSE(IsKvOp(Op::kRead));
  EXPECT_EQ(KvOpName(kKvMultiGet), "KV_MULTIGET");
  EXPECT_EQ(KvOpName(Op::kRead), "READ");
  auto key = Bytes("user:42");
  EXPECT_EQ(RoundTrip(kKvGet, false, KvKeyRequest{9, 7}, key).table, 9u);
  auto value = Bytes("hello world");
  EXPECT_EQ(RoundTrip(kKvGet, true, KvValueHeader{5, 11}, value).version, 5u);
  KvPutRequest put;
  put.table = 3;
  put.key_len = 7;
  put.expect_version = kMustBeAbsent;
  put.value_len = 11;
  EXPECT_EQ(RoundTrip(kKvPut, false, put, Cat(key, value)).expect_version, kMustBeAbsent);
  KvDeleteRequest del{3, 7, 12};
  EXPECT_EQ(RoundTrip(kKvDelete, false, del, key).expect_version, 12u);
  KvWriteResponse conflict{8, KvOutcome::kConflict};
  EXPECT_EQ(RoundTrip(kKvPut, true, conflict).outcome, KvOutcome::kConflict);
  EXPECT_EQ(RoundTrip(kKvCommit, true, KvWriteResponse{9}).version, 9u);
  KvInvokeRequest inv{1, 2, KvInvokeRequest::kNoPushback};
  EXPECT_EQ(RoundTrip(kKvInvoke, false, inv, value).function_id, 2u);
  EXPECT_EQ(RoundTrip(kKvInvoke, true, KvInvokeResponse{KvOutcome::kDone, 3}, value).attempts,
            3u);
  EXPECT_EQ(RoundTrip(kKvInvoke, true, KvInvokeResponse{KvOutcome::kPushedBack, 0}).outcome,
            KvOutcome::kPushedBack);

  std::vector<uint8_t> keys;
  AppendKvKey(keys, key);
  AppendKvKey(keys, Bytes("k2"));
  KvMultiGetRequest mg{1, 2};
  RoundTrip(kKvMultiGet, false, mg, keys);
  auto parsed = ParseKvMultiGetKeys(mg, keys);
  ASSERT_TRUE(parsed.ok());
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ(std::string((*parsed)[1].begin(), (*parsed)[1].end()), "k2");
  std::vector<uint8_t> resp;
  AppendKvValue(resp, 4, value);
  AppendKvValue(resp, 0, {});
  auto f = ParseResponse(kKvMultiGet, resp);
  ASSERT_TRUE(f.ok()) << f.status();
  auto values = ParseKvMultiGetResponse(f->data, 2);
  ASSERT_TRUE(values.ok());
  EXPECT_EQ((*values)[0].version, 4u);
  EXPECT_EQ((*values)[1].version, 0u);
  EXPECT_FALSE(ParseKvMultiGetResponse(f->data, 3).ok());

  std::vector<uint8_t> items;
  AppendKvCommitRead(items, key, 4);
  AppendKvCommitWrite(items, key, value, false);
  AppendKvCommitWrite(items, Bytes("gone"), {}, true);
  KvCommitRequest commit{1, 1, 2};
  RoundTrip(kKvCommit, false, commit, items);
  auto ci = ParseKvCommitItems(commit, items);
  ASSERT_TRUE(ci.ok());
  EXPECT_EQ(ci->reads[0].version, 4u);
  EXPECT_TRUE(ci->writes[1].is_delete);
}

TEST(KayakWireTest, KvFramesRejectBadInput) {
  auto key = Bytes("k");
  ExpectRejected(Frame(kKvGet, false, KvKeyRequest{0, 1}, key), "table id");
  ExpectRejected(Frame(kKvGet, false, KvKeyRequest{1, 2}, key), "key_len");
  std::vector<uint8_t> long_key(65, 'k');
  ExpectRejected(Frame(kKvDelete, false, KvDeleteRequest{1, 65}, long_key), "");
  KvPutRequest put;
  put.table = 1;
  put.key_len = 1;
  put.value_len = kMaxValueLength + 1;
  ExpectRejected(Frame(kKvPut, false, put, key), "");
  put.value_len = 3;
  ExpectRejected(Frame(kKvPut, false, put, Cat(key, Bytes("ab"))), "value_len");
  ExpectRejected(Frame(kKvInvoke, false, KvInvokeRequest{1, 0}), "function_id");
  ExpectRejected(Frame(kKvInvoke, false, KvInvokeRequest{1, 1, 6}), "flags");
  ExpectRejected(Frame(kKvInvoke, true, KvInvokeResponse{KvOutcome::kPushedBack, 0}, key), "pushed back");
  std::vector<uint8_t> keys;
  AppendKvKey(keys, key);
  keys.push_back(0);  // A stray byte.
  ExpectRejected(Frame(kKvMultiGet, false, KvMultiGetRequest{1, 1}, keys), "stray");
  std::vector<uint8_t> items;
  AppendKvCommitWrite(items, key, Bytes("a"), false);
  AppendKvCommitWrite(items, key, Bytes("b"), false);
  ExpectRejected(Frame(kKvCommit, false, KvCommitRequest{1, 0, 2}, items), "twice");
  std::vector<uint8_t> del_with_value;
  AppendKvCommitWrite(del_with_value, key, Bytes("a"), true);
  ExpectRejected(
      Frame(kKvCommit, false, KvCommitRequest{1, 0, 1}, del_with_value), "delete with a value");
  ExpectRejected(Frame(kKvGet, true, KvValueHeader{0, 1}, key), "");
}

// The bytes of a whole KV_PUT frame, written out by hand from the layout: what a client sent
// when the KV frames were fabric's own, and what it sends now.
TEST(KayakWireTest, KvPutFrameBytesAreUnchanged) {
  KvPutRequest put{3, 1, kMustBeAbsent, 2};
  auto frame = BuildRawFrame(FrameHeader{kKvPut, false, 7}, Payload(put, Bytes("k"), Bytes("vv")));
  const std::vector<uint8_t> want = {
      'T', 'S', 'R', 'A', 1, 0, 18, 0,                         // magic, version, op 18
      7, 0, 0, 0, 0, 0, 0, 0,                                  // request id
      0, 0, 0, 0, 27, 0, 0, 0,                                 // status, payload length
      3, 0, 0, 0, 1, 0, 0, 0,                                  // table, key_len, padding
      0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,          // expect_version: must be absent
      2, 0, 0, 0, 0, 0, 0, 0,                                  // value_len, padding
      'k', 'v', 'v'};
  EXPECT_EQ(frame, want);
  auto f = fabric::ParseFrame(frame, fabric::Direction::kRequest);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(ParseRequest(f->header.op, f->data).ok());
}

// The variable parts and the fixed responses, written out by hand from the layouts: the bytes
// clients and servers of every version exchange.
TEST(KayakWireTest, KvVariablePartsBytesAreUnchanged) {
  std::vector<uint8_t> keys;
  AppendKvKey(keys, Bytes("ab"));
  AppendKvKey(keys, Bytes("c"));
  EXPECT_EQ(keys, (std::vector<uint8_t>{2, 0, 'a', 'b', 1, 0, 'c'}));

  std::vector<uint8_t> items;
  AppendKvCommitRead(items, Bytes("k"), 0x0102030405060708);
  AppendKvCommitWrite(items, Bytes("k2"), Bytes("v"), false);
  AppendKvCommitWrite(items, Bytes("d"), {}, true);
  const std::vector<uint8_t> want_items = {
      8, 7, 6, 5, 4, 3, 2, 1,  // read: version
      1, 0, 0, 0, 0, 0, 0, 0,  // key length, padding
      'k',
      1, 0, 0, 0, 2, 0, 0, 0,  // write: value length, key length, flags
      'k', '2', 'v',
      0, 0, 0, 0, 1, 0, 1, 0,  // delete: no value, key length, flags kDelete
      'd'};
  EXPECT_EQ(items, want_items);

  std::vector<uint8_t> values;
  AppendKvValue(values, 5, Bytes("xy"));
  AppendKvValue(values, 0, {});
  const std::vector<uint8_t> want_values = {
      5, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0,  // version, value length, padding
      'x', 'y',
      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};  // an absent key
  EXPECT_EQ(values, want_values);

  EXPECT_EQ(Payload(KvWriteResponse{0x0a0b, KvOutcome::kConflict}),
            (std::vector<uint8_t>{0x0b, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(Payload(KvInvokeResponse{KvOutcome::kPushedBack, 0}),
            (std::vector<uint8_t>{2, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(Payload(KvInvokeResponse{KvOutcome::kDone, 0x0304}),
            (std::vector<uint8_t>{0, 0, 0, 0, 4, 3, 0, 0}));
}

void ExpectError(const Status& st, const std::vector<std::string>& needles) {
  ASSERT_FALSE(st.ok()) << "accepted input that should fail naming " << needles[0];
  EXPECT_EQ(st.code(), StatusCode::kProtocolError) << st;
  for (const std::string& n : needles) {
    EXPECT_NE(st.message().find(n), std::string::npos) << "no '" << n << "' in " << st;
  }
}

// Key lists, commit item lists and value lists cut short at every byte are refused, naming the
// list, the item and the field that did not fit (and nothing is read past the end).
TEST(KayakWireTest, TruncatedVariablePartsNameTheField) {
  std::vector<uint8_t> keys;
  AppendKvKey(keys, Bytes("key"));
  AppendKvKey(keys, Bytes("k2"));
  const KvMultiGetRequest mg{1, 2};
  for (size_t n = 0; n < keys.size(); ++n) {
    ExpectError(ParseKvMultiGetKeys(mg, std::span(keys).first(n)).status(), {"KV_MULTIGET"});
  }
  ExpectError(ParseKvMultiGetKeys(mg, std::span(keys).first(1)).status(), {"key 0", "key length"});
  ExpectError(ParseKvMultiGetKeys(mg, std::span(keys).first(7)).status(),
              {"key 1", "key needs 2 bytes, 0 left"});

  std::vector<uint8_t> items;
  AppendKvCommitRead(items, Bytes("rk"), 4);
  AppendKvCommitWrite(items, Bytes("wk"), Bytes("value"), false);
  const KvCommitRequest commit{1, 1, 1};
  ASSERT_TRUE(ParseKvCommitItems(commit, items).ok());
  for (size_t n = 0; n < items.size(); ++n) {
    ExpectError(ParseKvCommitItems(commit, std::span(items).first(n)).status(), {"KV_COMMIT"});
  }
  struct Cut {
    size_t size;
    std::string item, field;
  };
  for (const Cut& cut : {Cut{4, "read 0", "version"},
                         Cut{17, "read 0", "key needs 2 bytes, 1 left"},
                         Cut{20, "write 0", "value length"},
                         Cut{25, "write 0", "flags"},
                         Cut{27, "write 0", "key needs 2 bytes, 1 left"},
                         Cut{31, "write 0", "value needs 5 bytes, 3 left"}}) {
    ExpectError(ParseKvCommitItems(commit, std::span(items).first(cut.size)).status(),
                {cut.item, cut.field});
  }
  std::vector<uint8_t> padded = items;
  padded[12] = 1;  // In the read's padding.
  ExpectError(ParseKvCommitItems(commit, padded).status(), {"KV_COMMIT read", "padding"});

  std::vector<uint8_t> values;
  AppendKvValue(values, 3, Bytes("abc"));
  AppendKvValue(values, 4, Bytes("de"));
  ASSERT_TRUE(ParseKvMultiGetResponse(values, 2).ok());
  for (size_t n = 1; n < values.size(); ++n) {
    ExpectError(ParseKvMultiGetResponse(std::span(values).first(n), 2).status(),
                {"KV_MULTIGET response"});
  }
  ExpectError(ParseKvMultiGetResponse(std::span(values).first(10), 0).status(),
              {"entry 0", "value header"});
  ExpectError(ParseKvMultiGetResponse(std::span(values).first(18), 0).status(),
              {"entry 0", "value needs 3 bytes, 2 left"});
  ExpectError(ParseKvMultiGetResponse(std::span(values).first(36), 0).status(),
              {"entry 1", "value needs 2 bytes, 1 left"});
}

// The fixed responses refuse an unknown outcome and non-zero padding, naming the field.
TEST(KayakWireTest, MalformedResponsesNameTheField) {
  auto write = Payload(KvWriteResponse{3, KvOutcome::kDone});
  write[8] = 7;
  ExpectError(ParseResponse(kKvPut, write).status(), {"KV write response", "outcome 7"});
  write[8] = 0;
  write[15] = 1;
  ExpectError(ParseResponse(kKvPut, write).status(), {"KV write response", "padding"});
  auto invoke = Payload(KvInvokeResponse{KvOutcome::kDone, 1});
  invoke[0] = static_cast<uint8_t>(KvOutcome::kConflict);
  ExpectError(ParseResponse(kKvInvoke, invoke).status(), {"KV_INVOKE response", "outcome 1"});
  ExpectError(ParseResponse(kKvInvoke, Payload(KvInvokeResponse{KvOutcome::kDone, 0})).status(),
              {"KV_INVOKE response", "0 attempts"});
  ExpectError(KvInvokeResponse::Decode(std::span(invoke).first(5)).status(),
              {"KV_INVOKE response", "8 bytes, got 5"});
}

TEST(KayakWireTest, OnlyKvOpsAreParsed) {
  auto r = ParseRequest(Op{40}, Bytes("anything"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
  // A payload too short for its fixed part is refused by its size, naming the op.
  auto s = ParseRequest(kKvGet, Bytes("abc"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("KV_GET"), std::string::npos) << s.status();
}

// The key hash routes a key to its server: client and server must agree, for ever.
TEST(KayakWireTest, KeyHashIsStable) {
  EXPECT_EQ(KvKeyHash(Bytes("user:42"), 0), KvKeyHash(Bytes("user:42"), 0));
  EXPECT_NE(KvKeyHash(Bytes("user:42"), 0), KvKeyHash(Bytes("user:42"), 1));
  EXPECT_NE(KvKeyHash(Bytes("user:42"), 0), KvKeyHash(Bytes("user:43"), 0));
}

}  // namespace
}  // namespace tessera::kayak::wire
