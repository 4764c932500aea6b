// Kayak's wire format: the KV frames (ops 16..21, service ops of the fabric, fabric/wire.h),
// shared by the Kayak client (apps/kayak/client) and the Kayak service on the memserver
// (apps/kayak/server). A KV frame is a fabric frame: the 24-byte header, then one of the
// payloads below. The fabric engine checks the header and hands the payload to the service;
// ParseRequest / ParseResponse here check the layout completely, so every accepted payload
// re-encodes to the same bytes. The bytes are those of the ops 16..21 Tessera always spoke.
//
// Thread safety: all functions here are pure and may be called from any thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "common/status.h"
#include "fabric/wire.h"

namespace tessera::kayak::wire {

using fabric::Op;

// The KV ops: a range of the fabric's service ops, registered by the Kayak service.
inline constexpr Op kKvGet = Op{16};
inline constexpr Op kKvMultiGet = Op{17};
inline constexpr Op kKvPut = Op{18};
inline constexpr Op kKvDelete = Op{19};
inline constexpr Op kKvInvoke = Op{20};
inline constexpr Op kKvCommit = Op{21};
inline constexpr uint16_t kFirstOp = 16;
inline constexpr uint16_t kLastOp = 21;
static_assert(kFirstOp >= fabric::kFirstServiceOp && kLastOp <= fabric::kLastServiceOp);
inline bool IsKvOp(Op op) {
  return static_cast<uint16_t>(op) >= kFirstOp && static_cast<uint16_t>(op) <= kLastOp;
}
// "KV_GET", ..., or fabric::OpName for any other op (fabric names service ops by number).
std::string KvOpName(Op op);

// A memserver hosts KV tables (apps/kayak/server/kv_table.h) named by a non-zero 32-bit table id; a
// table comes into being with its first write. Keys are 1..kMaxKeyLength bytes, values
// 0..kMaxValueLength bytes. Every object carries a version (> 0, per table, increasing with
// every write); version 0 means "absent" wherever a version is expected.
//
//   KV_GET       req KvKeyRequest + key                 resp KvValueHeader + value
//                (a missing key is a NotFound error response)
//   KV_MULTIGET  req KvMultiGetRequest + count x (u16 key_len, key)
//                resp count x (KvValueHeader + value), version 0 and no bytes for a missing key
//   KV_PUT       req KvPutRequest + key + value         resp KvWriteResponse
//   KV_DELETE    req KvDeleteRequest + key              resp KvWriteResponse
//   KV_INVOKE    req KvInvokeRequest + args             resp KvInvokeResponse + result
//   KV_COMMIT    req KvCommitRequest + reads x (KvCommitRead + key)
//                    + writes x (KvCommitWrite + key + value)       resp KvWriteResponse
// A conditional write whose expected version does not match is not an error: it answers
// KvWriteResponse{outcome = kConflict, version = the current version (0: absent)}.
inline constexpr uint32_t kMaxKeyLength = 64;
inline constexpr uint32_t kMaxValueLength = 64u << 10;
inline constexpr uint32_t kMaxMultiGetKeys = 32;
inline constexpr uint32_t kMaxCommitItems = 32;
// expect_version values of KV_PUT / KV_DELETE besides an exact version.
inline constexpr uint64_t kAnyVersion = 0;              // Unconditional.
inline constexpr uint64_t kMustBeAbsent = ~uint64_t{0};  // PUT only: create, never overwrite.

struct KvKeyRequest {  // KV_GET
  static constexpr size_t kWireSize = 4 + 2 + 2;
  uint32_t table = 0;    // Non-zero.
  uint16_t key_len = 0;  // 1..kMaxKeyLength; the key follows.
  // 2 bytes of zero padding.
  void EncodeTo(uint8_t* out) const;
  static Result<KvKeyRequest> Decode(std::span<const uint8_t> b);
};

struct KvValueHeader {  // KV_GET response, and each entry of a KV_MULTIGET response.
  static constexpr size_t kWireSize = 8 + 4 + 4;
  uint64_t version = 0;    // 0: absent (MULTIGET only; then value_len is 0).
  uint32_t value_len = 0;  // 0..kMaxValueLength; the value follows.
  // 4 bytes of zero padding.
  void EncodeTo(uint8_t* out) const;
  static Result<KvValueHeader> Decode(std::span<const uint8_t> b);
};

struct KvMultiGetRequest {
  static constexpr size_t kWireSize = 4 + 2 + 2;
  uint32_t table = 0;
  uint16_t count = 0;  // 1..kMaxMultiGetKeys keys follow, each as u16 length + bytes.
  // 2 bytes of zero padding.
  void EncodeTo(uint8_t* out) const;
  static Result<KvMultiGetRequest> Decode(std::span<const uint8_t> b);
};

struct KvPutRequest {
  static constexpr size_t kWireSize = 4 + 2 + 2 + 8 + 4 + 4;
  uint32_t table = 0;
  uint16_t key_len = 0;
  // 2 bytes of zero padding.
  uint64_t expect_version = kAnyVersion;  // kAnyVersion, kMustBeAbsent or an exact version.
  uint32_t value_len = 0;  // 0..kMaxValueLength; key then value follow.
  // 4 bytes of zero padding.
  void EncodeTo(uint8_t* out) const;
  static Result<KvPutRequest> Decode(std::span<const uint8_t> b);
};

struct KvDeleteRequest {
  static constexpr size_t kWireSize = 4 + 2 + 2 + 8;
  uint32_t table = 0;
  uint16_t key_len = 0;
  // 2 bytes of zero padding.
  uint64_t expect_version = kAnyVersion;  // kAnyVersion or an exact version.
  void EncodeTo(uint8_t* out) const;
  static Result<KvDeleteRequest> Decode(std::span<const uint8_t> b);
};

enum class KvOutcome : uint32_t {
  kDone = 0,
  kConflict = 1,    // PUT/DELETE/COMMIT: a version did not match; nothing was written.
  kPushedBack = 2,  // INVOKE: the function pool is saturated; run it the KV way instead.
};
inline constexpr uint32_t kMaxKvOutcome = 2;

struct KvWriteResponse {  // KV_PUT, KV_DELETE, KV_COMMIT.
  static constexpr size_t kWireSize = 8 + 4 + 4;
  uint64_t version = 0;  // kDone: the version written (0 after a delete); kConflict: current.
  KvOutcome outcome = KvOutcome::kDone;  // kDone or kConflict.
  // 4 bytes of zero padding.
  void EncodeTo(uint8_t* out) const;
  static Result<KvWriteResponse> Decode(std::span<const uint8_t> b);
};

struct KvInvokeRequest {
  static constexpr size_t kWireSize = 4 + 4 + 4 + 4;
  uint32_t table = 0;
  uint32_t function_id = 0;  // Non-zero.
  uint32_t flags = 0;        // kNoPushback.
  // 4 bytes of zero padding. The argument bytes (<= kMaxDataLength - kWireSize) follow.
  static constexpr uint32_t kNoPushback = 1;  // Queue even when the pool is saturated.
  void EncodeTo(uint8_t* out) const;
  static Result<KvInvokeRequest> Decode(std::span<const uint8_t> b);
};

struct KvInvokeResponse {
  static constexpr size_t kWireSize = 4 + 4;
  KvOutcome outcome = KvOutcome::kDone;  // kDone (result follows) or kPushedBack (nothing).
  uint32_t attempts = 0;  // kDone: how many times the function ran (optimistic retries + 1).
  void EncodeTo(uint8_t* out) const;
  static Result<KvInvokeResponse> Decode(std::span<const uint8_t> b);
};

struct KvCommitRequest {
  static constexpr size_t kWireSize = 4 + 2 + 2;
  uint32_t table = 0;
  uint16_t reads = 0;   // 0..kMaxCommitItems KvCommitRead entries follow,
  uint16_t writes = 0;  // then 1..kMaxCommitItems KvCommitWrite entries.
  void EncodeTo(uint8_t* out) const;
  static Result<KvCommitRequest> Decode(std::span<const uint8_t> b);
};
struct KvCommitRead {  // The version a transaction read (0: it saw the key absent); key follows.
  static constexpr size_t kWireSize = 8 + 2 + 6;
  uint64_t version = 0;
  uint16_t key_len = 0;
  // 6 bytes of zero padding.
};
struct KvCommitWrite {  // key then value follow.
  static constexpr size_t kWireSize = 4 + 2 + 2;
  uint32_t value_len = 0;
  uint16_t key_len = 0;
  uint16_t flags = 0;  // kDelete (then value_len is 0).
  static constexpr uint16_t kDelete = 1;
};

// A parsed KV_MULTIGET request key list / KV_COMMIT item list / KV_MULTIGET response, as views
// into the frame. The Parse* helpers validate completely (ParseFrame uses them for requests;
// clients use ParseKvMultiGetResponse on the data of a response).
struct KvCommitItem {
  std::span<const uint8_t> key;
  uint64_t version = 0;             // Reads.
  std::span<const uint8_t> value;   // Writes.
  bool is_delete = false;           // Writes.
};
struct KvCommitItems {
  std::vector<KvCommitItem> reads;
  std::vector<KvCommitItem> writes;
};
Result<std::vector<std::span<const uint8_t>>> ParseKvMultiGetKeys(const KvMultiGetRequest& req,
                                                                  std::span<const uint8_t> data);
Result<KvCommitItems> ParseKvCommitItems(const KvCommitRequest& req,
                                         std::span<const uint8_t> data);
struct KvValueView {
  uint64_t version = 0;  // 0: absent.
  std::span<const uint8_t> value;
};
Result<std::vector<KvValueView>> ParseKvMultiGetResponse(std::span<const uint8_t> data,
                                                         size_t expected_count);
// Encoders for the variable parts (append to `out`).
void AppendKvKey(std::vector<uint8_t>& out, std::span<const uint8_t> key);  // u16 len + bytes
void AppendKvCommitRead(std::vector<uint8_t>& out, std::span<const uint8_t> key,
                        uint64_t version);
void AppendKvCommitWrite(std::vector<uint8_t>& out, std::span<const uint8_t> key,
                         std::span<const uint8_t> value, bool is_delete);
void AppendKvValue(std::vector<uint8_t>& out, uint64_t version, std::span<const uint8_t> value);

// A validated KV payload: `body` is its decoded fixed part, `data` views the variable bytes
// that follow it (keys, values, arguments, a result) inside the parsed buffer.
struct ParsedKv {
  Op op = kKvGet;
  std::variant<std::monostate, KvKeyRequest, KvValueHeader, KvMultiGetRequest, KvPutRequest,
               KvDeleteRequest, KvWriteResponse, KvInvokeRequest, KvInvokeResponse,
               KvCommitRequest>
      body;
  std::span<const uint8_t> data;
};
// The payload of a KV request / of an OK KV response, checked completely (sizes, padding,
// lengths, item lists). ProtocolError naming the op and the problem; InvalidArgument for an op
// that is not a KV op.
Result<ParsedKv> ParseRequest(Op op, std::span<const uint8_t> payload);
Result<ParsedKv> ParseResponse(Op op, std::span<const uint8_t> payload);

// A KV payload: `body`'s fixed part, then `a`, then `b` (a key and a value, say).
template <typename Body>
std::vector<uint8_t> Payload(const Body& body, std::span<const uint8_t> a = {},
                             std::span<const uint8_t> b = {}) {
  std::vector<uint8_t> out(Body::kWireSize + a.size() + b.size());
  body.EncodeTo(out.data());
  std::copy(a.begin(), a.end(), out.begin() + Body::kWireSize);
  std::copy(b.begin(), b.end(), out.begin() + Body::kWireSize + a.size());
  return out;
}

}  // namespace tessera::kayak::wire
