// The payloads of the KV frames (ops 16..21), the helpers that build and parse their variable
// parts, and the whole-payload checks of requests and responses.
#include "apps/kayak/wire/wire.h"

#include <cstring>
#include <string>

#include "common/coding.h"
#include "fabric/wire_checks.h"

namespace tessera::kayak::wire {

using fabric::kMaxDataLength;
using fabric::kMaxPayloadLength;
using fabric::wire_checks::CheckPad;
using fabric::wire_checks::Short;

namespace {
Status CheckTable(const char* what, uint32_t table) {
  if (table == 0) return ProtocolError(what, ": table id must be non-zero");
  return Status::Ok();
}
Status CheckKeyLength(const char* what, uint32_t key_len) {
  if (key_len == 0 || key_len > kMaxKeyLength) {
    return ProtocolError(what, ": key length ", key_len, " outside 1..", kMaxKeyLength);
  }
  return Status::Ok();
}
Status CheckValueLength(const char* what, uint32_t value_len) {
  if (value_len > kMaxValueLength) {
    return ProtocolError(what, ": value length ", value_len, " exceeds ", kMaxValueLength);
  }
  return Status::Ok();
}
// The reader's first error (the field that did not fit), preceded by the list and the item.
Status ItemError(const SpanReader& in, const char* item, size_t i) {
  return in.status().WithContext(std::string(item) + " " + std::to_string(i));
}
}  // namespace

void KvKeyRequest::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize).PutFixed32(table).PutFixed16(key_len).PutZeros(2);
}
Result<KvKeyRequest> KvKeyRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("KV_GET", kWireSize, b.size());
  KvKeyRequest r;
  SpanReader in(b);
  r.table = in.GetFixed32("table");
  r.key_len = in.GetFixed16("key_len");
  TESSERA_RETURN_IF_ERROR(CheckPad("KV_GET", in.GetBytes(2, "padding").data(), 2));
  TESSERA_RETURN_IF_ERROR(CheckTable("KV_GET", r.table));
  TESSERA_RETURN_IF_ERROR(CheckKeyLength("KV_GET", r.key_len));
  return r;
}

void KvValueHeader::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize).PutFixed64(version).PutFixed32(value_len).PutZeros(4);
}
Result<KvValueHeader> KvValueHeader::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("KV value", kWireSize, b.size());
  KvValueHeader r;
  SpanReader in(b);
  r.version = in.GetFixed64("version");
  r.value_len = in.GetFixed32("value_len");
  TESSERA_RETURN_IF_ERROR(CheckPad("KV value", in.GetBytes(4, "padding").data(), 4));
  TESSERA_RETURN_IF_ERROR(CheckValueLength("KV value", r.value_len));
  if (r.version == 0 && r.value_len != 0) {
    return ProtocolError("KV value: an absent key (version 0) with ", r.value_len, " value bytes");
  }
  return r;
}

void KvMultiGetRequest::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize).PutFixed32(table).PutFixed16(count).PutZeros(2);
}
Result<KvMultiGetRequest> KvMultiGetRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("KV_MULTIGET", kWireSize, b.size());
  KvMultiGetRequest r;
  SpanReader in(b);
  r.table = in.GetFixed32("table");
  r.count = in.GetFixed16("count");
  TESSERA_RETURN_IF_ERROR(CheckPad("KV_MULTIGET", in.GetBytes(2, "padding").data(), 2));
  TESSERA_RETURN_IF_ERROR(CheckTable("KV_MULTIGET", r.table));
  if (r.count == 0 || r.count > kMaxMultiGetKeys) {
    return ProtocolError("KV_MULTIGET: count ", r.count, " outside 1..", kMaxMultiGetKeys);
  }
  return r;
}

void KvPutRequest::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize)
      .PutFixed32(table)
      .PutFixed16(key_len)
      .PutZeros(2)
      .PutFixed64(expect_version)
      .PutFixed32(value_len)
      .PutZeros(4);
}
Result<KvPutRequest> KvPutRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("KV_PUT", kWireSize, b.size());
  KvPutRequest r;
  SpanReader in(b);
  r.table = in.GetFixed32("table");
  r.key_len = in.GetFixed16("key_len");
  TESSERA_RETURN_IF_ERROR(CheckPad("KV_PUT", in.GetBytes(2, "padding").data(), 2));
  r.expect_version = in.GetFixed64("expect_version");
  r.value_len = in.GetFixed32("value_len");
  TESSERA_RETURN_IF_ERROR(CheckPad("KV_PUT", in.GetBytes(4, "padding").data(), 4));
  TESSERA_RETURN_IF_ERROR(CheckTable("KV_PUT", r.table));
  TESSERA_RETURN_IF_ERROR(CheckKeyLength("KV_PUT", r.key_len));
  TESSERA_RETURN_IF_ERROR(CheckValueLength("KV_PUT", r.value_len));
  return r;
}

void KvDeleteRequest::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize)
      .PutFixed32(table)
      .PutFixed16(key_len)
      .PutZeros(2)
      .PutFixed64(expect_version);
}
Result<KvDeleteRequest> KvDeleteRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("KV_DELETE", kWireSize, b.size());
  KvDeleteRequest r;
  SpanReader in(b);
  r.table = in.GetFixed32("table");
  r.key_len = in.GetFixed16("key_len");
  TESSERA_RETURN_IF_ERROR(CheckPad("KV_DELETE", in.GetBytes(2, "padding").data(), 2));
  r.expect_version = in.GetFixed64("expect_version");
  TESSERA_RETURN_IF_ERROR(CheckTable("KV_DELETE", r.table));
  TESSERA_RETURN_IF_ERROR(CheckKeyLength("KV_DELETE", r.key_len));
  if (r.expect_version == kMustBeAbsent) {
    return ProtocolError("KV_DELETE: expect_version 'must be absent' makes no sense");
  }
  return r;
}

void KvWriteResponse::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize)
      .PutFixed64(version)
      .PutFixed32(static_cast<uint32_t>(outcome))
      .PutZeros(4);
}
Result<KvWriteResponse> KvWriteResponse::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("KV write response", kWireSize, b.size());
  KvWriteResponse r;
  SpanReader in(b);
  r.version = in.GetFixed64("version");
  const uint32_t outcome = in.GetFixed32("outcome");
  TESSERA_RETURN_IF_ERROR(CheckPad("KV write response", in.GetBytes(4, "padding").data(), 4));
  if (outcome != static_cast<uint32_t>(KvOutcome::kDone) &&
      outcome != static_cast<uint32_t>(KvOutcome::kConflict)) {
    return ProtocolError("KV write response: outcome ", outcome, " is not done or conflict");
  }
  r.outcome = static_cast<KvOutcome>(outcome);
  return r;
}

void KvInvokeRequest::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize)
      .PutFixed32(table)
      .PutFixed32(function_id)
      .PutFixed32(flags)
      .PutZeros(4);
}
Result<KvInvokeRequest> KvInvokeRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("KV_INVOKE", kWireSize, b.size());
  KvInvokeRequest r;
  SpanReader in(b);
  r.table = in.GetFixed32("table");
  r.function_id = in.GetFixed32("function_id");
  r.flags = in.GetFixed32("flags");
  TESSERA_RETURN_IF_ERROR(CheckPad("KV_INVOKE", in.GetBytes(4, "padding").data(), 4));
  TESSERA_RETURN_IF_ERROR(CheckTable("KV_INVOKE", r.table));
  if (r.function_id == 0) return ProtocolError("KV_INVOKE: function_id must be non-zero");
  if ((r.flags & ~kNoPushback) != 0) return ProtocolError("KV_INVOKE: unknown flags ", r.flags);
  return r;
}

void KvInvokeResponse::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize).PutFixed32(static_cast<uint32_t>(outcome)).PutFixed32(attempts);
}
Result<KvInvokeResponse> KvInvokeResponse::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("KV_INVOKE response", kWireSize, b.size());
  KvInvokeResponse r;
  SpanReader in(b);
  const uint32_t outcome = in.GetFixed32("outcome");
  r.attempts = in.GetFixed32("attempts");
  if (outcome == static_cast<uint32_t>(KvOutcome::kDone)) {
    if (r.attempts == 0) return ProtocolError("KV_INVOKE response: done after 0 attempts");
  } else if (outcome == static_cast<uint32_t>(KvOutcome::kPushedBack)) {
    if (r.attempts != 0) return ProtocolError("KV_INVOKE response: pushed back with attempts");
  } else {
    return ProtocolError("KV_INVOKE response: outcome ", outcome, " is not done or pushed back");
  }
  r.outcome = static_cast<KvOutcome>(outcome);
  return r;
}

void KvCommitRequest::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize).PutFixed32(table).PutFixed16(reads).PutFixed16(writes);
}
Result<KvCommitRequest> KvCommitRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("KV_COMMIT", kWireSize, b.size());
  KvCommitRequest r;
  SpanReader in(b);
  r.table = in.GetFixed32("table");
  r.reads = in.GetFixed16("reads");
  r.writes = in.GetFixed16("writes");
  TESSERA_RETURN_IF_ERROR(CheckTable("KV_COMMIT", r.table));
  if (r.reads > kMaxCommitItems) {
    return ProtocolError("KV_COMMIT: ", r.reads, " reads exceed ", kMaxCommitItems);
  }
  if (r.writes == 0 || r.writes > kMaxCommitItems) {
    return ProtocolError("KV_COMMIT: writes ", r.writes, " outside 1..", kMaxCommitItems);
  }
  return r;
}

Result<std::vector<std::span<const uint8_t>>> ParseKvMultiGetKeys(const KvMultiGetRequest& req,
                                                                  std::span<const uint8_t> data) {
  std::vector<std::span<const uint8_t>> keys;
  keys.reserve(req.count);
  SpanReader in(data);
  for (uint32_t i = 0; i < req.count; ++i) {
    const uint16_t len = in.GetFixed16("key length");
    if (!in.ok()) return ItemError(in, "KV_MULTIGET key", i);
    TESSERA_RETURN_IF_ERROR(CheckKeyLength("KV_MULTIGET", len));
    keys.push_back(in.GetBytes(len, "key"));
    if (!in.ok()) return ItemError(in, "KV_MULTIGET key", i);
  }
  if (in.left() != 0) {
    return ProtocolError("KV_MULTIGET: ", in.left(), " stray bytes after the keys");
  }
  return keys;
}

Result<KvCommitItems> ParseKvCommitItems(const KvCommitRequest& req,
                                         std::span<const uint8_t> data) {
  KvCommitItems items;
  SpanReader in(data);
  for (uint32_t i = 0; i < req.reads; ++i) {
    KvCommitItem it;
    it.version = in.GetFixed64("version");
    const uint16_t len = in.GetFixed16("key length");
    const auto pad = in.GetBytes(6, "padding");
    if (!in.ok()) return ItemError(in, "KV_COMMIT read", i);
    TESSERA_RETURN_IF_ERROR(CheckPad("KV_COMMIT read", pad.data(), pad.size()));
    TESSERA_RETURN_IF_ERROR(CheckKeyLength("KV_COMMIT read", len));
    if (it.version == kMustBeAbsent) return ProtocolError("KV_COMMIT: read version ~0");
    it.key = in.GetBytes(len, "key");
    if (!in.ok()) return ItemError(in, "KV_COMMIT read", i);
    items.reads.push_back(it);
  }
  for (uint32_t i = 0; i < req.writes; ++i) {
    KvCommitItem it;
    const uint32_t vlen = in.GetFixed32("value length");
    const uint16_t klen = in.GetFixed16("key length");
    const uint16_t flags = in.GetFixed16("flags");
    if (!in.ok()) return ItemError(in, "KV_COMMIT write", i);
    if ((flags & ~KvCommitWrite::kDelete) != 0) {
      return ProtocolError("KV_COMMIT: write ", i, " has unknown flags ", flags);
    }
    it.is_delete = (flags & KvCommitWrite::kDelete) != 0;
    TESSERA_RETURN_IF_ERROR(CheckKeyLength("KV_COMMIT write", klen));
    TESSERA_RETURN_IF_ERROR(CheckValueLength("KV_COMMIT write", vlen));
    if (it.is_delete && vlen != 0) return ProtocolError("KV_COMMIT: a delete with a value");
    it.key = in.GetBytes(klen, "key");
    it.value = in.GetBytes(vlen, "value");
    if (!in.ok()) return ItemError(in, "KV_COMMIT write", i);
    items.writes.push_back(it);
  }
  if (in.left() != 0) {
    return ProtocolError("KV_COMMIT: ", in.left(), " stray bytes after the items");
  }
  for (size_t i = 0; i < items.writes.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      const auto& a = items.writes[i].key;
      const auto& b = items.writes[j].key;
      if (a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0) {
        return ProtocolError("KV_COMMIT: key written twice");
      }
    }
  }
  return items;
}

Result<std::vector<KvValueView>> ParseKvMultiGetResponse(std::span<const uint8_t> data,
                                                         size_t expected_count) {
  std::vector<KvValueView> out;
  out.reserve(expected_count);
  SpanReader in(data);
  while (in.left() != 0) {
    const auto header = in.GetBytes(KvValueHeader::kWireSize, "value header");
    if (!in.ok()) return ItemError(in, "KV_MULTIGET response entry", out.size());
    TESSERA_ASSIGN_OR_RETURN(KvValueHeader h, KvValueHeader::Decode(header));
    const auto value = in.GetBytes(h.value_len, "value");
    if (!in.ok()) return ItemError(in, "KV_MULTIGET response entry", out.size());
    out.push_back({h.version, value});
  }
  if (expected_count != 0 && out.size() != expected_count) {
    return ProtocolError("KV_MULTIGET response: ", out.size(), " entries for ", expected_count,
                         " keys");
  }
  return out;
}

void AppendKvKey(std::vector<uint8_t>& out, std::span<const uint8_t> key) {
  SpanWriter::AppendTo(out, 2 + key.size())
      .PutFixed16(static_cast<uint16_t>(key.size()))
      .PutBytes(key);
}
void AppendKvCommitRead(std::vector<uint8_t>& out, std::span<const uint8_t> key, uint64_t version) {
  SpanWriter::AppendTo(out, KvCommitRead::kWireSize + key.size())
      .PutFixed64(version)
      .PutFixed16(static_cast<uint16_t>(key.size()))
      .PutZeros(6)
      .PutBytes(key);
}
void AppendKvCommitWrite(std::vector<uint8_t>& out, std::span<const uint8_t> key,
                         std::span<const uint8_t> value, bool is_delete) {
  SpanWriter::AppendTo(out, KvCommitWrite::kWireSize + key.size() + value.size())
      .PutFixed32(static_cast<uint32_t>(value.size()))
      .PutFixed16(static_cast<uint16_t>(key.size()))
      .PutFixed16(is_delete ? KvCommitWrite::kDelete : 0)
      .PutBytes(key)
      .PutBytes(value);
}
void AppendKvValue(std::vector<uint8_t>& out, uint64_t version, std::span<const uint8_t> value) {
  const size_t at = out.size();
  out.resize(at + KvValueHeader::kWireSize);
  KvValueHeader{version, static_cast<uint32_t>(value.size())}.EncodeTo(out.data() + at);
  out.insert(out.end(), value.begin(), value.end());
}

// ---- whole payloads -----------------------------------------------------------------------

namespace {

constexpr uint16_t U(Op op) { return static_cast<uint16_t>(op); }

struct SizeRule {
  uint32_t min;
  uint32_t max;
};
SizeRule RequestRule(Op op) {
  switch (static_cast<uint16_t>(op)) {
    case U(kKvGet):
      return {KvKeyRequest::kWireSize + 1, KvKeyRequest::kWireSize + kMaxKeyLength};
    case U(kKvMultiGet):
      return {KvMultiGetRequest::kWireSize + 3,
              KvMultiGetRequest::kWireSize + kMaxMultiGetKeys * (2 + kMaxKeyLength)};
    case U(kKvPut):
      return {KvPutRequest::kWireSize + 1,
              KvPutRequest::kWireSize + kMaxKeyLength + kMaxValueLength};
    case U(kKvDelete):
      return {KvDeleteRequest::kWireSize + 1, KvDeleteRequest::kWireSize + kMaxKeyLength};
    case U(kKvInvoke):
      return {KvInvokeRequest::kWireSize, kMaxDataLength};
    case U(kKvCommit):
      return {KvCommitRequest::kWireSize + KvCommitWrite::kWireSize + 1,
              KvCommitRequest::kWireSize +
                  kMaxCommitItems * (KvCommitRead::kWireSize + kMaxKeyLength) +
                  kMaxCommitItems * (KvCommitWrite::kWireSize + kMaxKeyLength + kMaxValueLength)};
  }
  return {1, 0};
}
static_assert(KvCommitRequest::kWireSize +
                      kMaxCommitItems * (KvCommitRead::kWireSize + kMaxKeyLength) +
                      kMaxCommitItems *
                          (KvCommitWrite::kWireSize + kMaxKeyLength + kMaxValueLength) <=
                  kMaxPayloadLength,
              "a full KV_COMMIT must fit in one frame");
static_assert(kMaxMultiGetKeys * (KvValueHeader::kWireSize + kMaxValueLength) <= kMaxDataLength,
              "a full KV_MULTIGET response must fit in one frame");

SizeRule ResponseRule(Op op) {
  switch (static_cast<uint16_t>(op)) {
    case U(kKvGet):
      return {KvValueHeader::kWireSize, KvValueHeader::kWireSize + kMaxValueLength};
    case U(kKvMultiGet):
      return {KvValueHeader::kWireSize,
              kMaxMultiGetKeys * (KvValueHeader::kWireSize + kMaxValueLength)};
    case U(kKvPut):
    case U(kKvDelete):
    case U(kKvCommit):
      return {KvWriteResponse::kWireSize, KvWriteResponse::kWireSize};
    case U(kKvInvoke):
      return {KvInvokeResponse::kWireSize, kMaxDataLength};
  }
  return {1, 0};
}

Status CheckSize(Op op, bool response, std::span<const uint8_t> payload) {
  if (!IsKvOp(op)) return InvalidArgument(fabric::OpName(op), " is not a KV op");
  const SizeRule rule = response ? ResponseRule(op) : RequestRule(op);
  if (payload.size() < rule.min || payload.size() > rule.max) {
    return ProtocolError(KvOpName(op), response ? " response" : " request", " payload of ",
                         payload.size(), " bytes outside ", rule.min, "..", rule.max);
  }
  return Status::Ok();
}

template <typename T>
Status DecodeFixed(ParsedKv* f, std::span<const uint8_t> payload) {
  return fabric::wire_checks::DecodeFixedPart<T>(KvOpName(f->op), payload, f);
}

}  // namespace

std::string KvOpName(Op op) {
  switch (static_cast<uint16_t>(op)) {
    case U(kKvGet):
      return "KV_GET";
    case U(kKvMultiGet):
      return "KV_MULTIGET";
    case U(kKvPut):
      return "KV_PUT";
    case U(kKvDelete):
      return "KV_DELETE";
    case U(kKvInvoke):
      return "KV_INVOKE";
    case U(kKvCommit):
      return "KV_COMMIT";
  }
  return fabric::OpName(op);
}

Result<ParsedKv> ParseRequest(Op op, std::span<const uint8_t> payload) {
  TESSERA_RETURN_IF_ERROR(CheckSize(op, false, payload));
  ParsedKv f;
  f.op = op;
  switch (static_cast<uint16_t>(op)) {
    case U(kKvGet): {
      TESSERA_RETURN_IF_ERROR(DecodeFixed<KvKeyRequest>(&f, payload));
      const auto& r = std::get<KvKeyRequest>(f.body);
      if (f.data.size() != r.key_len) {
        return ProtocolError("KV_GET: key_len ", r.key_len, " but ", f.data.size(),
                             " bytes follow");
      }
      break;
    }
    case U(kKvMultiGet):
      TESSERA_RETURN_IF_ERROR(DecodeFixed<KvMultiGetRequest>(&f, payload));
      TESSERA_RETURN_IF_ERROR(
          ParseKvMultiGetKeys(std::get<KvMultiGetRequest>(f.body), f.data).status());
      break;
    case U(kKvPut): {
      TESSERA_RETURN_IF_ERROR(DecodeFixed<KvPutRequest>(&f, payload));
      const auto& r = std::get<KvPutRequest>(f.body);
      if (f.data.size() != size_t{r.key_len} + r.value_len) {
        return ProtocolError("KV_PUT: key_len ", r.key_len, " + value_len ", r.value_len, " but ",
                             f.data.size(), " bytes follow");
      }
      break;
    }
    case U(kKvDelete): {
      TESSERA_RETURN_IF_ERROR(DecodeFixed<KvDeleteRequest>(&f, payload));
      const auto& r = std::get<KvDeleteRequest>(f.body);
      if (f.data.size() != r.key_len) {
        return ProtocolError("KV_DELETE: key_len ", r.key_len, " but ", f.data.size(),
                             " bytes follow");
      }
      break;
    }
    case U(kKvInvoke):
      TESSERA_RETURN_IF_ERROR(DecodeFixed<KvInvokeRequest>(&f, payload));
      break;
    case U(kKvCommit):
      TESSERA_RETURN_IF_ERROR(DecodeFixed<KvCommitRequest>(&f, payload));
      TESSERA_RETURN_IF_ERROR(
          ParseKvCommitItems(std::get<KvCommitRequest>(f.body), f.data).status());
      break;
  }
  return f;
}

Result<ParsedKv> ParseResponse(Op op, std::span<const uint8_t> payload) {
  TESSERA_RETURN_IF_ERROR(CheckSize(op, true, payload));
  ParsedKv f;
  f.op = op;
  switch (static_cast<uint16_t>(op)) {
    case U(kKvGet): {
      TESSERA_RETURN_IF_ERROR(DecodeFixed<KvValueHeader>(&f, payload));
      const auto& r = std::get<KvValueHeader>(f.body);
      if (r.version == 0) return ProtocolError("KV_GET response with version 0");
      if (f.data.size() != r.value_len) {
        return ProtocolError("KV_GET response: value_len ", r.value_len, " but ", f.data.size(),
                             " bytes follow");
      }
      break;
    }
    case U(kKvMultiGet):
      TESSERA_RETURN_IF_ERROR(ParseKvMultiGetResponse(payload, 0).status());
      f.data = payload;
      break;
    case U(kKvPut):
    case U(kKvDelete):
    case U(kKvCommit):
      TESSERA_RETURN_IF_ERROR(DecodeFixed<KvWriteResponse>(&f, payload));
      break;
    case U(kKvInvoke):
      TESSERA_RETURN_IF_ERROR(DecodeFixed<KvInvokeResponse>(&f, payload));
      if (std::get<KvInvokeResponse>(f.body).outcome == KvOutcome::kPushedBack && !f.data.empty()) {
        return ProtocolError("KV_INVOKE response: pushed back with a result");
      }
      break;
  }
  return f;
}

}  // namespace tessera::kayak::wire
