#include "fabric/wire.h"

#include <cstring>

namespace tessera::fabric {
namespace {

Status Short(const char* what, size_t want, size_t got) {
  return ProtocolError(what, " payload must be ", want, " bytes, got ", got);
}

bool AllZero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

Status CheckPad(const char* what, const uint8_t* p, size_t n) {
  if (!AllZero(p, n)) return ProtocolError(what, ": padding bytes must be zero");
  return Status::Ok();
}

Status CheckDataLength(const char* what, uint32_t length) {
  if (length == 0 || length > kMaxDataLength) {
    return ProtocolError(what, ": length ", length, " outside 1..", kMaxDataLength);
  }
  return Status::Ok();
}

// The payload sizes a frame of (op, direction) may have, before looking inside.
struct SizeRule {
  uint32_t min;
  uint32_t max;
};

SizeRule RequestRule(Op op) {
  switch (op) {
    case Op::kHello:
      return {HelloRequest::kWireSize, HelloRequest::kWireSize + 8};
    case Op::kAuth: return {AuthRequest::kWireSize, AuthRequest::kWireSize};
    case Op::kAllocSlab: return {AllocSlabRequest::kWireSize, AllocSlabRequest::kWireSize};
    case Op::kFreeSlab: return {FreeSlabRequest::kWireSize, FreeSlabRequest::kWireSize};
    case Op::kRead: return {ReadRequest::kWireSize, ReadRequest::kWireSize};
    case Op::kWrite:
      return {WriteRequest::kWireSize + 1, WriteRequest::kWireSize + kMaxDataLength};
    case Op::kStats: return {0, 0};
    case Op::kHeartbeat: return {0, 0};
    case Op::kInvoke: return {InvokeRequest::kWireSize, InvokeRequest::kWireSize + kMaxDataLength};
    case Op::kFault: return {FaultRequest::kWireSize, FaultRequest::kWireSize};
    case Op::kNotice: return {1, 0};  // Never a request: min > max rejects every size.
    case Op::kGoodbye: return {0, 0};
    case Op::kReadV:
      return {VectorRequest::kWireSize + VectorRange::kWireSize,
              VectorRequest::kWireSize + VectorRange::kWireSize * kMaxVectorRanges};
    case Op::kWriteV:
      return {VectorRequest::kWireSize + VectorRange::kWireSize + 1,
              VectorRequest::kWireSize + VectorRange::kWireSize * kMaxVectorRanges +
                  kMaxDataLength};
    case Op::kKvGet: return {KvKeyRequest::kWireSize + 1, KvKeyRequest::kWireSize + kMaxKeyLength};
    case Op::kKvMultiGet:
      return {KvMultiGetRequest::kWireSize + 3,
              KvMultiGetRequest::kWireSize + kMaxMultiGetKeys * (2 + kMaxKeyLength)};
    case Op::kKvPut:
      return {KvPutRequest::kWireSize + 1,
              KvPutRequest::kWireSize + kMaxKeyLength + kMaxValueLength};
    case Op::kKvDelete:
      return {KvDeleteRequest::kWireSize + 1, KvDeleteRequest::kWireSize + kMaxKeyLength};
    case Op::kKvInvoke: return {KvInvokeRequest::kWireSize, kMaxDataLength};
    case Op::kKvCommit:
      return {KvCommitRequest::kWireSize + KvCommitWrite::kWireSize + 1,
              KvCommitRequest::kWireSize +
                  kMaxCommitItems * (KvCommitRead::kWireSize + kMaxKeyLength) +
                  kMaxCommitItems * (KvCommitWrite::kWireSize + kMaxKeyLength + kMaxValueLength)};
  }
  return {1, 0};
}
static_assert(KvCommitRequest::kWireSize +
                  kMaxCommitItems * (KvCommitRead::kWireSize + kMaxKeyLength) +
                  kMaxCommitItems * (KvCommitWrite::kWireSize + kMaxKeyLength + kMaxValueLength) <=
              kMaxPayloadLength, "a full KV_COMMIT must fit in one frame");
static_assert(kMaxMultiGetKeys * (KvValueHeader::kWireSize + kMaxValueLength) <= kMaxDataLength,
              "a full KV_MULTIGET response must fit in one frame");
static_assert(VectorRequest::kWireSize + VectorRange::kWireSize * kMaxVectorRanges +
                  kMaxDataLength <= kMaxPayloadLength,
              "a full WRITEV must fit in one frame");

SizeRule ResponseRule(Op op) {
  switch (op) {
    case Op::kHello: return {ChallengeResponse::kWireSize, ChallengeResponse::kWireSize};
    case Op::kAuth: return {AuthOkResponse::kWireSize, AuthOkResponse::kWireSize};
    case Op::kAllocSlab: return {AllocSlabResponse::kWireSize, AllocSlabResponse::kWireSize};
    case Op::kFreeSlab: return {0, 0};
    case Op::kRead: return {1, kMaxDataLength};
    case Op::kWrite: return {0, 0};
    case Op::kStats: return {0, kMaxDataLength};
    case Op::kHeartbeat: return {HeartbeatResponse::kWireSize, HeartbeatResponse::kWireSize};
    case Op::kInvoke: return {0, kMaxDataLength};
    case Op::kFault: return {0, 0};
    case Op::kNotice: return {Notice::kWireSize, Notice::kWireSize};
    case Op::kGoodbye: return {0, 0};
    case Op::kReadV: return {1, kMaxDataLength};
    case Op::kWriteV: return {0, 0};
    case Op::kKvGet:
      return {KvValueHeader::kWireSize, KvValueHeader::kWireSize + kMaxValueLength};
    case Op::kKvMultiGet:
      return {KvValueHeader::kWireSize,
              kMaxMultiGetKeys * (KvValueHeader::kWireSize + kMaxValueLength)};
    case Op::kKvPut:
    case Op::kKvDelete:
    case Op::kKvCommit: return {KvWriteResponse::kWireSize, KvWriteResponse::kWireSize};
    case Op::kKvInvoke: return {KvInvokeResponse::kWireSize, kMaxDataLength};
  }
  return {1, 0};
}

bool IsKnownStatus(uint32_t v) { return v <= static_cast<uint32_t>(StatusCode::kIoError); }

}  // namespace

std::string OpName(Op op) {
  switch (op) {
    case Op::kHello: return "HELLO";
    case Op::kAuth: return "AUTH";
    case Op::kAllocSlab: return "ALLOC_SLAB";
    case Op::kFreeSlab: return "FREE_SLAB";
    case Op::kRead: return "READ";
    case Op::kWrite: return "WRITE";
    case Op::kStats: return "STATS";
    case Op::kHeartbeat: return "HEARTBEAT";
    case Op::kInvoke: return "INVOKE";
    case Op::kFault: return "FAULT";
    case Op::kNotice: return "NOTICE";
    case Op::kGoodbye: return "GOODBYE";
    case Op::kReadV: return "READV";
    case Op::kWriteV: return "WRITEV";
    case Op::kKvGet: return "KV_GET";
    case Op::kKvMultiGet: return "KV_MULTIGET";
    case Op::kKvPut: return "KV_PUT";
    case Op::kKvDelete: return "KV_DELETE";
    case Op::kKvInvoke: return "KV_INVOKE";
    case Op::kKvCommit: return "KV_COMMIT";
  }
  return "UNKNOWN(" + std::to_string(static_cast<unsigned>(op)) + ")";
}

bool IsKnownOp(uint16_t value) {
  return (value >= 1 && value <= kMaxOpValue) || (value >= kFirstKvOp && value <= kLastKvOp);
}

std::string FaultActionName(FaultAction a) {
  switch (a) {
    case FaultAction::kClear: return "clear";
    case FaultAction::kDelay: return "delay";
    case FaultAction::kHang: return "hang";
    case FaultAction::kDropConnection: return "drop";
    case FaultAction::kCrash: return "crash";
    case FaultAction::kEvictSlabs: return "evict";
  }
  return "unknown(" + std::to_string(static_cast<uint32_t>(a)) + ")";
}

void EncodeHeader(const FrameHeader& h, uint8_t* out) {
  PutU32(out, kMagic);
  PutU16(out + 4, kProtocolVersion);
  PutU16(out + 6, static_cast<uint16_t>(static_cast<uint16_t>(h.op) | (h.response ? kResponseBit : 0)));
  PutU64(out + 8, h.request_id);
  PutU32(out + 16, static_cast<uint32_t>(h.status));
  PutU32(out + 20, h.payload_len);
}

Result<FrameHeader> DecodeHeader(std::span<const uint8_t> b, Direction expected) {
  if (b.size() < kHeaderSize) {
    return ProtocolError("frame header needs ", kHeaderSize, " bytes, got ", b.size());
  }
  const uint8_t* p = b.data();
  uint32_t magic = GetU32(p);
  if (magic != kMagic) return ProtocolError("bad magic 0x", std::hex, magic);
  uint16_t version = GetU16(p + 4);
  if (version != kProtocolVersion) {
    return ProtocolError("unsupported protocol version ", version, " (want ", kProtocolVersion, ")");
  }
  uint16_t raw_op = GetU16(p + 6);
  bool response = (raw_op & kResponseBit) != 0;
  uint16_t op_value = raw_op & static_cast<uint16_t>(~kResponseBit);
  if (!IsKnownOp(op_value)) return ProtocolError("unknown op ", op_value);
  FrameHeader h;
  h.op = static_cast<Op>(op_value);
  h.response = response;
  if (response != (expected == Direction::kResponse)) {
    return ProtocolError(OpName(h.op), response ? " response where a request was expected"
                                                : " request where a response was expected");
  }
  h.request_id = GetU64(p + 8);
  uint32_t status = GetU32(p + 16);
  h.payload_len = GetU32(p + 20);
  if (h.payload_len > kMaxPayloadLength) {
    return ProtocolError(OpName(h.op), ": payload_len ", h.payload_len, " exceeds ",
                         kMaxPayloadLength);
  }
  if (!response) {
    if (status != 0) return ProtocolError(OpName(h.op), " request with non-zero status ", status);
  } else {
    if (!IsKnownStatus(status)) return ProtocolError(OpName(h.op), ": unknown status ", status);
  }
  h.status = static_cast<StatusCode>(status);
  if (h.op == Op::kNotice && h.request_id != 0) {
    return ProtocolError("NOTICE with non-zero request_id ", h.request_id);
  }
  if (h.op == Op::kNotice && h.status != StatusCode::kOk) {
    return ProtocolError("NOTICE with non-zero status");
  }
  if (response && h.status != StatusCode::kOk) {
    if (h.payload_len > kMaxErrorMessageLength) {
      return ProtocolError(OpName(h.op), " error response: message of ", h.payload_len,
                           " bytes exceeds ", kMaxErrorMessageLength);
    }
    return h;
  }
  SizeRule rule = response ? ResponseRule(h.op) : RequestRule(h.op);
  if (rule.min > rule.max) {
    return ProtocolError(OpName(h.op), " is not valid as a ", response ? "response" : "request");
  }
  if (h.payload_len < rule.min || h.payload_len > rule.max) {
    if (rule.min == rule.max) {
      return ProtocolError(OpName(h.op), response ? " response" : " request", " payload must be ",
                           rule.min, " bytes, got ", h.payload_len);
    }
    return ProtocolError(OpName(h.op), response ? " response" : " request", " payload_len ",
                         h.payload_len, " outside ", rule.min, "..", rule.max);
  }
  return h;
}

// ---- payloads ----

void HelloRequest::EncodeTo(uint8_t* out) const {
  std::memcpy(out, client_nonce.data(), kNonceSize);
  PutU64(out + 32, client_id);
  PutU16(out + 40, min_version);
  PutU16(out + 42, max_version);
}
Result<HelloRequest> HelloRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("HELLO", kWireSize, b.size());
  HelloRequest r;
  std::memcpy(r.client_nonce.data(), b.data(), kNonceSize);
  r.client_id = GetU64(b.data() + 32);
  r.min_version = GetU16(b.data() + 40);
  r.max_version = GetU16(b.data() + 42);
  if (r.client_id == 0) return ProtocolError("HELLO: client_id must be non-zero");
  if (r.min_version == 0 || r.min_version > r.max_version) {
    return ProtocolError("HELLO: bad version range ", r.min_version, "..", r.max_version);
  }
  return r;
}

void ChallengeResponse::EncodeTo(uint8_t* out) const {
  std::memcpy(out, server_nonce.data(), kNonceSize);
  PutU64(out + 32, server_id);
  PutU16(out + 40, version);
  PutU16(out + 42, 0);
}
Result<ChallengeResponse> ChallengeResponse::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("CHALLENGE", kWireSize, b.size());
  ChallengeResponse r;
  std::memcpy(r.server_nonce.data(), b.data(), kNonceSize);
  r.server_id = GetU64(b.data() + 32);
  r.version = GetU16(b.data() + 40);
  TESSERA_RETURN_IF_ERROR(CheckPad("CHALLENGE", b.data() + 42, 2));
  if (r.server_id == 0) return ProtocolError("CHALLENGE: server_id must be non-zero");
  if (r.version != kProtocolVersion) {
    return ProtocolError("CHALLENGE: server chose unsupported version ", r.version);
  }
  return r;
}

void AuthRequest::EncodeTo(uint8_t* out) const { std::memcpy(out, client_mac.data(), kMacSize); }
Result<AuthRequest> AuthRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("AUTH", kWireSize, b.size());
  AuthRequest r;
  std::memcpy(r.client_mac.data(), b.data(), kMacSize);
  return r;
}

void AuthOkResponse::EncodeTo(uint8_t* out) const {
  std::memcpy(out, server_mac.data(), kMacSize);
  PutU64(out + 32, slab_size);
  PutU64(out + 40, capacity_bytes);
  PutU64(out + 48, rdma_token);
  PutU32(out + 56, flags);
  PutU16(out + 60, rdma_port);
  PutU16(out + 62, 0);
  std::memset(out + 64, 0, kMaxRdmaHostLength);
  std::memcpy(out + 64, rdma_host.data(), std::min(rdma_host.size(), kMaxRdmaHostLength));
}
Result<AuthOkResponse> AuthOkResponse::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("AUTH_OK", kWireSize, b.size());
  const uint8_t* p = b.data();
  AuthOkResponse r;
  std::memcpy(r.server_mac.data(), p, kMacSize);
  r.slab_size = GetU64(p + 32);
  r.capacity_bytes = GetU64(p + 40);
  r.rdma_token = GetU64(p + 48);
  r.flags = GetU32(p + 56);
  r.rdma_port = GetU16(p + 60);
  TESSERA_RETURN_IF_ERROR(CheckPad("AUTH_OK", p + 62, 2));
  if ((r.flags & ~kRdmaOffered) != 0) return ProtocolError("AUTH_OK: unknown flags ", r.flags);
  const uint8_t* host = p + 64;
  size_t n = 0;
  while (n < kMaxRdmaHostLength && host[n] != 0) ++n;
  TESSERA_RETURN_IF_ERROR(CheckPad("AUTH_OK rdma_host", host + n, kMaxRdmaHostLength - n));
  for (size_t i = 0; i < n; ++i) {
    if (host[i] < 0x21 || host[i] > 0x7e) {
      return ProtocolError("AUTH_OK: rdma_host has a non-printable byte");
    }
  }
  r.rdma_host.assign(reinterpret_cast<const char*>(host), n);
  if (r.flags & kRdmaOffered) {
    if (r.rdma_port == 0 || r.rdma_host.empty()) {
      return ProtocolError("AUTH_OK: RDMA offered without a host and port");
    }
  } else if (r.rdma_port != 0 || !r.rdma_host.empty() || r.rdma_token != 0) {
    return ProtocolError("AUTH_OK: RDMA fields set but RDMA not offered");
  }
  return r;
}

void AllocSlabRequest::EncodeTo(uint8_t* out) const { PutU64(out, size_hint); }
Result<AllocSlabRequest> AllocSlabRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("ALLOC_SLAB", kWireSize, b.size());
  AllocSlabRequest r;
  r.size_hint = GetU64(b.data());
  return r;
}

void AllocSlabResponse::EncodeTo(uint8_t* out) const {
  PutU64(out, slab_id);
  PutU64(out + 8, size);
  PutU64(out + 16, remote_addr);
  PutU32(out + 24, rkey);
  PutU32(out + 28, 0);
}
Result<AllocSlabResponse> AllocSlabResponse::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("ALLOC_SLAB response", kWireSize, b.size());
  AllocSlabResponse r;
  r.slab_id = GetU64(b.data());
  r.size = GetU64(b.data() + 8);
  r.remote_addr = GetU64(b.data() + 16);
  r.rkey = GetU32(b.data() + 24);
  TESSERA_RETURN_IF_ERROR(CheckPad("ALLOC_SLAB response", b.data() + 28, 4));
  if (r.slab_id == 0) return ProtocolError("ALLOC_SLAB response: slab_id must be non-zero");
  if (r.size == 0) return ProtocolError("ALLOC_SLAB response: size must be non-zero");
  if (r.remote_addr + r.size < r.remote_addr) {
    return ProtocolError("ALLOC_SLAB response: remote_addr + size overflows");
  }
  return r;
}

void FreeSlabRequest::EncodeTo(uint8_t* out) const { PutU64(out, slab_id); }
Result<FreeSlabRequest> FreeSlabRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("FREE_SLAB", kWireSize, b.size());
  FreeSlabRequest r;
  r.slab_id = GetU64(b.data());
  if (r.slab_id == 0) return ProtocolError("FREE_SLAB: slab_id must be non-zero");
  return r;
}

namespace {
template <typename T>
void EncodeRw(const T& r, uint8_t* out) {
  PutU64(out, r.slab_id);
  PutU64(out + 8, r.offset);
  PutU32(out + 16, r.length);
  PutU32(out + 20, 0);
}
template <typename T>
Result<T> DecodeRw(const char* what, std::span<const uint8_t> b) {
  if (b.size() != T::kWireSize) return Short(what, T::kWireSize, b.size());
  T r;
  r.slab_id = GetU64(b.data());
  r.offset = GetU64(b.data() + 8);
  r.length = GetU32(b.data() + 16);
  TESSERA_RETURN_IF_ERROR(CheckPad(what, b.data() + 20, 4));
  if (r.slab_id == 0) return ProtocolError(what, ": slab_id must be non-zero");
  TESSERA_RETURN_IF_ERROR(CheckDataLength(what, r.length));
  if (r.offset + r.length < r.offset) return ProtocolError(what, ": offset + length overflows");
  return r;
}
}  // namespace

void ReadRequest::EncodeTo(uint8_t* out) const { EncodeRw(*this, out); }
Result<ReadRequest> ReadRequest::Decode(std::span<const uint8_t> b) {
  return DecodeRw<ReadRequest>("READ", b);
}
void WriteRequest::EncodeTo(uint8_t* out) const { EncodeRw(*this, out); }
Result<WriteRequest> WriteRequest::Decode(std::span<const uint8_t> b) {
  return DecodeRw<WriteRequest>("WRITE", b);
}
void VectorRange::EncodeTo(uint8_t* out) const { EncodeRw(*this, out); }
Result<VectorRange> VectorRange::Decode(std::span<const uint8_t> b) {
  return DecodeRw<VectorRange>("vector range", b);
}
VectorRange VectorRangeAt(std::span<const uint8_t> data, uint32_t i) {
  const uint8_t* p = data.data() + size_t{i} * VectorRange::kWireSize;
  VectorRange r;
  r.slab_id = GetU64(p);
  r.offset = GetU64(p + 8);
  r.length = GetU32(p + 16);
  return r;
}

void VectorRequest::EncodeTo(uint8_t* out) const {
  PutU32(out, count);
  PutU32(out + 4, total_length);
}
Result<VectorRequest> VectorRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("vector request", kWireSize, b.size());
  VectorRequest v;
  v.count = GetU32(b.data());
  v.total_length = GetU32(b.data() + 4);
  if (v.count == 0 || v.count > kMaxVectorRanges) {
    return ProtocolError("vector request: count ", v.count, " outside 1..", kMaxVectorRanges);
  }
  TESSERA_RETURN_IF_ERROR(CheckDataLength("vector request total", v.total_length));
  return v;
}

void HeartbeatResponse::EncodeTo(uint8_t* out) const {
  PutU64(out, server_time_ns);
  PutU64(out + 8, free_bytes);
  PutU64(out + 16, total_bytes);
  PutU32(out + 24, slabs_used);
  PutU32(out + 28, slabs_free);
  PutU32(out + 32, load_permille);
  PutU32(out + 36, connections);
}
Result<HeartbeatResponse> HeartbeatResponse::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("HEARTBEAT response", kWireSize, b.size());
  const uint8_t* p = b.data();
  HeartbeatResponse r;
  r.server_time_ns = GetU64(p);
  r.free_bytes = GetU64(p + 8);
  r.total_bytes = GetU64(p + 16);
  r.slabs_used = GetU32(p + 24);
  r.slabs_free = GetU32(p + 28);
  r.load_permille = GetU32(p + 32);
  r.connections = GetU32(p + 36);
  if (r.free_bytes > r.total_bytes) {
    return ProtocolError("HEARTBEAT: free_bytes ", r.free_bytes, " > total_bytes ", r.total_bytes);
  }
  if (r.load_permille > 1000) return ProtocolError("HEARTBEAT: load_permille ", r.load_permille, " > 1000");
  return r;
}

void InvokeRequest::EncodeTo(uint8_t* out) const {
  PutU32(out, function_id);
  PutU32(out + 4, 0);
}
Result<InvokeRequest> InvokeRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("INVOKE", kWireSize, b.size());
  InvokeRequest r;
  r.function_id = GetU32(b.data());
  TESSERA_RETURN_IF_ERROR(CheckPad("INVOKE", b.data() + 4, 4));
  return r;
}

void FaultRequest::EncodeTo(uint8_t* out) const {
  PutU32(out, static_cast<uint32_t>(action));
  PutU32(out + 4, op_mask);
  PutU64(out + 8, delay_us);
  PutU64(out + 16, duration_ms);
  PutU64(out + 24, count);
}
Result<FaultRequest> FaultRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("FAULT", kWireSize, b.size());
  const uint8_t* p = b.data();
  uint32_t action = GetU32(p);
  if (action > kMaxFaultAction) return ProtocolError("FAULT: unknown action ", action);
  FaultRequest r;
  r.action = static_cast<FaultAction>(action);
  r.op_mask = GetU32(p + 4);
  r.delay_us = GetU64(p + 8);
  r.duration_ms = GetU64(p + 16);
  r.count = GetU64(p + 24);
  uint32_t valid_mask = ((1u << (kMaxOpValue + 1)) - 1) & ~1u;
  if ((r.op_mask & ~valid_mask) != 0) return ProtocolError("FAULT: op_mask has unknown op bits");
  if (r.delay_us > 3600ull * 1000000) return ProtocolError("FAULT: delay_us above one hour");
  if (r.action == FaultAction::kDelay && r.delay_us == 0) {
    return ProtocolError("FAULT: delay action needs delay_us > 0");
  }
  return r;
}

void Notice::EncodeTo(uint8_t* out) const {
  PutU32(out, static_cast<uint32_t>(kind));
  PutU32(out + 4, 0);
  PutU64(out + 8, slab_id);
  PutU64(out + 16, deadline_ms);
}
Result<Notice> Notice::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("NOTICE", kWireSize, b.size());
  const uint8_t* p = b.data();
  uint32_t kind = GetU32(p);
  if (kind == 0 || kind > kMaxNoticeKind) return ProtocolError("NOTICE: unknown kind ", kind);
  Notice n;
  n.kind = static_cast<NoticeKind>(kind);
  TESSERA_RETURN_IF_ERROR(CheckPad("NOTICE", p + 4, 4));
  n.slab_id = GetU64(p + 8);
  n.deadline_ms = GetU64(p + 16);
  if (n.kind == NoticeKind::kSlabEvicting && n.slab_id == 0) {
    return ProtocolError("NOTICE: slab eviction without a slab_id");
  }
  if (n.kind == NoticeKind::kShuttingDown && n.slab_id != 0) {
    return ProtocolError("NOTICE: shutdown notice with a slab_id");
  }
  return n;
}

// ---- KV payloads ----

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
}  // namespace

void KvKeyRequest::EncodeTo(uint8_t* out) const {
  PutU32(out, table);
  PutU16(out + 4, key_len);
  PutU16(out + 6, 0);
}
Result<KvKeyRequest> KvKeyRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("KV_GET", kWireSize, b.size());
  KvKeyRequest r;
  r.table = GetU32(b.data());
  r.key_len = GetU16(b.data() + 4);
  TESSERA_RETURN_IF_ERROR(CheckPad("KV_GET", b.data() + 6, 2));
  TESSERA_RETURN_IF_ERROR(CheckTable("KV_GET", r.table));
  TESSERA_RETURN_IF_ERROR(CheckKeyLength("KV_GET", r.key_len));
  return r;
}

void KvValueHeader::EncodeTo(uint8_t* out) const {
  PutU64(out, version);
  PutU32(out + 8, value_len);
  PutU32(out + 12, 0);
}
Result<KvValueHeader> KvValueHeader::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("KV value", kWireSize, b.size());
  KvValueHeader r;
  r.version = GetU64(b.data());
  r.value_len = GetU32(b.data() + 8);
  TESSERA_RETURN_IF_ERROR(CheckPad("KV value", b.data() + 12, 4));
  TESSERA_RETURN_IF_ERROR(CheckValueLength("KV value", r.value_len));
  if (r.version == 0 && r.value_len != 0) {
    return ProtocolError("KV value: an absent key (version 0) with ", r.value_len, " value bytes");
  }
  return r;
}

void KvMultiGetRequest::EncodeTo(uint8_t* out) const {
  PutU32(out, table);
  PutU16(out + 4, count);
  PutU16(out + 6, 0);
}
Result<KvMultiGetRequest> KvMultiGetRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("KV_MULTIGET", kWireSize, b.size());
  KvMultiGetRequest r;
  r.table = GetU32(b.data());
  r.count = GetU16(b.data() + 4);
  TESSERA_RETURN_IF_ERROR(CheckPad("KV_MULTIGET", b.data() + 6, 2));
  TESSERA_RETURN_IF_ERROR(CheckTable("KV_MULTIGET", r.table));
  if (r.count == 0 || r.count > kMaxMultiGetKeys) {
    return ProtocolError("KV_MULTIGET: count ", r.count, " outside 1..", kMaxMultiGetKeys);
  }
  return r;
}

void KvPutRequest::EncodeTo(uint8_t* out) const {
  PutU32(out, table);
  PutU16(out + 4, key_len);
  PutU16(out + 6, 0);
  PutU64(out + 8, expect_version);
  PutU32(out + 16, value_len);
  PutU32(out + 20, 0);
}
Result<KvPutRequest> KvPutRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("KV_PUT", kWireSize, b.size());
  KvPutRequest r;
  r.table = GetU32(b.data());
  r.key_len = GetU16(b.data() + 4);
  TESSERA_RETURN_IF_ERROR(CheckPad("KV_PUT", b.data() + 6, 2));
  r.expect_version = GetU64(b.data() + 8);
  r.value_len = GetU32(b.data() + 16);
  TESSERA_RETURN_IF_ERROR(CheckPad("KV_PUT", b.data() + 20, 4));
  TESSERA_RETURN_IF_ERROR(CheckTable("KV_PUT", r.table));
  TESSERA_RETURN_IF_ERROR(CheckKeyLength("KV_PUT", r.key_len));
  TESSERA_RETURN_IF_ERROR(CheckValueLength("KV_PUT", r.value_len));
  return r;
}

void KvDeleteRequest::EncodeTo(uint8_t* out) const {
  PutU32(out, table);
  PutU16(out + 4, key_len);
  PutU16(out + 6, 0);
  PutU64(out + 8, expect_version);
}
Result<KvDeleteRequest> KvDeleteRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("KV_DELETE", kWireSize, b.size());
  KvDeleteRequest r;
  r.table = GetU32(b.data());
  r.key_len = GetU16(b.data() + 4);
  TESSERA_RETURN_IF_ERROR(CheckPad("KV_DELETE", b.data() + 6, 2));
  r.expect_version = GetU64(b.data() + 8);
  TESSERA_RETURN_IF_ERROR(CheckTable("KV_DELETE", r.table));
  TESSERA_RETURN_IF_ERROR(CheckKeyLength("KV_DELETE", r.key_len));
  if (r.expect_version == kMustBeAbsent) {
    return ProtocolError("KV_DELETE: expect_version 'must be absent' makes no sense");
  }
  return r;
}

void KvWriteResponse::EncodeTo(uint8_t* out) const {
  PutU64(out, version);
  PutU32(out + 8, static_cast<uint32_t>(outcome));
  PutU32(out + 12, 0);
}
Result<KvWriteResponse> KvWriteResponse::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("KV write response", kWireSize, b.size());
  KvWriteResponse r;
  r.version = GetU64(b.data());
  uint32_t outcome = GetU32(b.data() + 8);
  TESSERA_RETURN_IF_ERROR(CheckPad("KV write response", b.data() + 12, 4));
  if (outcome != static_cast<uint32_t>(KvOutcome::kDone) &&
      outcome != static_cast<uint32_t>(KvOutcome::kConflict)) {
    return ProtocolError("KV write response: outcome ", outcome, " is not done or conflict");
  }
  r.outcome = static_cast<KvOutcome>(outcome);
  return r;
}

void KvInvokeRequest::EncodeTo(uint8_t* out) const {
  PutU32(out, table);
  PutU32(out + 4, function_id);
  PutU32(out + 8, flags);
  PutU32(out + 12, 0);
}
Result<KvInvokeRequest> KvInvokeRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("KV_INVOKE", kWireSize, b.size());
  KvInvokeRequest r;
  r.table = GetU32(b.data());
  r.function_id = GetU32(b.data() + 4);
  r.flags = GetU32(b.data() + 8);
  TESSERA_RETURN_IF_ERROR(CheckPad("KV_INVOKE", b.data() + 12, 4));
  TESSERA_RETURN_IF_ERROR(CheckTable("KV_INVOKE", r.table));
  if (r.function_id == 0) return ProtocolError("KV_INVOKE: function_id must be non-zero");
  if ((r.flags & ~kNoPushback) != 0) return ProtocolError("KV_INVOKE: unknown flags ", r.flags);
  return r;
}

void KvInvokeResponse::EncodeTo(uint8_t* out) const {
  PutU32(out, static_cast<uint32_t>(outcome));
  PutU32(out + 4, attempts);
}
Result<KvInvokeResponse> KvInvokeResponse::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("KV_INVOKE response", kWireSize, b.size());
  KvInvokeResponse r;
  uint32_t outcome = GetU32(b.data());
  r.attempts = GetU32(b.data() + 4);
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
  PutU32(out, table);
  PutU16(out + 4, reads);
  PutU16(out + 6, writes);
}
Result<KvCommitRequest> KvCommitRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("KV_COMMIT", kWireSize, b.size());
  KvCommitRequest r;
  r.table = GetU32(b.data());
  r.reads = GetU16(b.data() + 4);
  r.writes = GetU16(b.data() + 6);
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
  size_t off = 0;
  for (uint32_t i = 0; i < req.count; ++i) {
    if (data.size() - off < 2) return ProtocolError("KV_MULTIGET: key ", i, " truncated");
    uint16_t len = GetU16(data.data() + off);
    off += 2;
    TESSERA_RETURN_IF_ERROR(CheckKeyLength("KV_MULTIGET", len));
    if (data.size() - off < len) return ProtocolError("KV_MULTIGET: key ", i, " truncated");
    keys.push_back(data.subspan(off, len));
    off += len;
  }
  if (off != data.size()) {
    return ProtocolError("KV_MULTIGET: ", data.size() - off, " stray bytes after the keys");
  }
  return keys;
}

Result<KvCommitItems> ParseKvCommitItems(const KvCommitRequest& req,
                                         std::span<const uint8_t> data) {
  KvCommitItems items;
  size_t off = 0;
  for (uint32_t i = 0; i < req.reads; ++i) {
    if (data.size() - off < KvCommitRead::kWireSize) {
      return ProtocolError("KV_COMMIT: read ", i, " truncated");
    }
    const uint8_t* p = data.data() + off;
    KvCommitItem it;
    it.version = GetU64(p);
    uint16_t len = GetU16(p + 8);
    TESSERA_RETURN_IF_ERROR(CheckPad("KV_COMMIT read", p + 10, 6));
    TESSERA_RETURN_IF_ERROR(CheckKeyLength("KV_COMMIT read", len));
    if (it.version == kMustBeAbsent) return ProtocolError("KV_COMMIT: read version ~0");
    off += KvCommitRead::kWireSize;
    if (data.size() - off < len) return ProtocolError("KV_COMMIT: read ", i, " key truncated");
    it.key = data.subspan(off, len);
    off += len;
    items.reads.push_back(it);
  }
  for (uint32_t i = 0; i < req.writes; ++i) {
    if (data.size() - off < KvCommitWrite::kWireSize) {
      return ProtocolError("KV_COMMIT: write ", i, " truncated");
    }
    const uint8_t* p = data.data() + off;
    KvCommitItem it;
    uint32_t vlen = GetU32(p);
    uint16_t klen = GetU16(p + 4);
    uint16_t flags = GetU16(p + 6);
    if ((flags & ~KvCommitWrite::kDelete) != 0) {
      return ProtocolError("KV_COMMIT: write ", i, " has unknown flags ", flags);
    }
    it.is_delete = (flags & KvCommitWrite::kDelete) != 0;
    TESSERA_RETURN_IF_ERROR(CheckKeyLength("KV_COMMIT write", klen));
    TESSERA_RETURN_IF_ERROR(CheckValueLength("KV_COMMIT write", vlen));
    if (it.is_delete && vlen != 0) return ProtocolError("KV_COMMIT: a delete with a value");
    off += KvCommitWrite::kWireSize;
    if (data.size() - off < size_t{klen} + vlen) {
      return ProtocolError("KV_COMMIT: write ", i, " truncated");
    }
    it.key = data.subspan(off, klen);
    it.value = data.subspan(off + klen, vlen);
    off += size_t{klen} + vlen;
    items.writes.push_back(it);
  }
  if (off != data.size()) {
    return ProtocolError("KV_COMMIT: ", data.size() - off, " stray bytes after the items");
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
  size_t off = 0;
  while (off < data.size()) {
    if (data.size() - off < KvValueHeader::kWireSize) {
      return ProtocolError("KV_MULTIGET response: entry ", out.size(), " truncated");
    }
    TESSERA_ASSIGN_OR_RETURN(KvValueHeader h,
                             KvValueHeader::Decode(data.subspan(off, KvValueHeader::kWireSize)));
    off += KvValueHeader::kWireSize;
    if (data.size() - off < h.value_len) {
      return ProtocolError("KV_MULTIGET response: value ", out.size(), " truncated");
    }
    out.push_back({h.version, data.subspan(off, h.value_len)});
    off += h.value_len;
  }
  if (expected_count != 0 && out.size() != expected_count) {
    return ProtocolError("KV_MULTIGET response: ", out.size(), " entries for ", expected_count,
                         " keys");
  }
  return out;
}

void AppendKvKey(std::vector<uint8_t>& out, std::span<const uint8_t> key) {
  size_t at = out.size();
  out.resize(at + 2 + key.size());
  PutU16(out.data() + at, static_cast<uint16_t>(key.size()));
  if (!key.empty()) std::memcpy(out.data() + at + 2, key.data(), key.size());
}
void AppendKvCommitRead(std::vector<uint8_t>& out, std::span<const uint8_t> key,
                        uint64_t version) {
  size_t at = out.size();
  out.resize(at + KvCommitRead::kWireSize + key.size(), 0);
  PutU64(out.data() + at, version);
  PutU16(out.data() + at + 8, static_cast<uint16_t>(key.size()));
  std::memcpy(out.data() + at + KvCommitRead::kWireSize, key.data(), key.size());
}
void AppendKvCommitWrite(std::vector<uint8_t>& out, std::span<const uint8_t> key,
                         std::span<const uint8_t> value, bool is_delete) {
  size_t at = out.size();
  out.resize(at + KvCommitWrite::kWireSize + key.size() + value.size(), 0);
  uint8_t* p = out.data() + at;
  PutU32(p, static_cast<uint32_t>(value.size()));
  PutU16(p + 4, static_cast<uint16_t>(key.size()));
  PutU16(p + 6, is_delete ? KvCommitWrite::kDelete : 0);
  std::memcpy(p + KvCommitWrite::kWireSize, key.data(), key.size());
  if (!value.empty()) std::memcpy(p + KvCommitWrite::kWireSize + key.size(), value.data(), value.size());
}
void AppendKvValue(std::vector<uint8_t>& out, uint64_t version, std::span<const uint8_t> value) {
  size_t at = out.size();
  out.resize(at + KvValueHeader::kWireSize + value.size());
  KvValueHeader h{version, static_cast<uint32_t>(value.size())};
  h.EncodeTo(out.data() + at);
  if (!value.empty()) std::memcpy(out.data() + at + KvValueHeader::kWireSize, value.data(), value.size());
}

// ---- whole frames ----

std::vector<uint8_t> BuildRawFrame(FrameHeader h, std::span<const uint8_t> data) {
  std::vector<uint8_t> out(kHeaderSize + data.size());
  h.payload_len = static_cast<uint32_t>(data.size());
  EncodeHeader(h, out.data());
  if (!data.empty()) std::memcpy(out.data() + kHeaderSize, data.data(), data.size());
  return out;
}

namespace {
template <typename T>
Status DecodeFixed(ParsedFrame* f, std::span<const uint8_t> payload) {
  if (payload.size() < T::kWireSize) return Short(OpName(f->header.op).c_str(), T::kWireSize, payload.size());
  TESSERA_ASSIGN_OR_RETURN(T body, T::Decode(payload.first(T::kWireSize)));
  f->body = body;
  f->data = payload.subspan(T::kWireSize);
  return Status::Ok();
}
}  // namespace

Result<ParsedFrame> ParseFrame(std::span<const uint8_t> bytes, Direction direction) {
  if (bytes.size() < kHeaderSize) return Unavailable("need ", kHeaderSize - bytes.size(), " more header bytes");
  ParsedFrame f;
  TESSERA_ASSIGN_OR_RETURN(f.header, DecodeHeader(bytes.first(kHeaderSize), direction));
  f.frame_size = kHeaderSize + f.header.payload_len;
  if (bytes.size() < f.frame_size) {
    return Unavailable("need ", f.frame_size - bytes.size(), " more payload bytes");
  }
  std::span<const uint8_t> payload = bytes.subspan(kHeaderSize, f.header.payload_len);
  const FrameHeader& h = f.header;
  if (h.response && h.status != StatusCode::kOk) {
    f.data = payload;  // The error message.
    return f;
  }
  if (!h.response) {
    switch (h.op) {
      case Op::kHello: TESSERA_RETURN_IF_ERROR(DecodeFixed<HelloRequest>(&f, payload)); break;
      case Op::kAuth: TESSERA_RETURN_IF_ERROR(DecodeFixed<AuthRequest>(&f, payload)); break;
      case Op::kAllocSlab: TESSERA_RETURN_IF_ERROR(DecodeFixed<AllocSlabRequest>(&f, payload)); break;
      case Op::kFreeSlab: TESSERA_RETURN_IF_ERROR(DecodeFixed<FreeSlabRequest>(&f, payload)); break;
      case Op::kRead: TESSERA_RETURN_IF_ERROR(DecodeFixed<ReadRequest>(&f, payload)); break;
      case Op::kWrite: {
        TESSERA_RETURN_IF_ERROR(DecodeFixed<WriteRequest>(&f, payload));
        const auto& w = std::get<WriteRequest>(f.body);
        if (f.data.size() != w.length) {
          return ProtocolError("WRITE: length field ", w.length, " but ", f.data.size(),
                               " data bytes follow");
        }
        break;
      }
      case Op::kInvoke: TESSERA_RETURN_IF_ERROR(DecodeFixed<InvokeRequest>(&f, payload)); break;
      case Op::kFault: TESSERA_RETURN_IF_ERROR(DecodeFixed<FaultRequest>(&f, payload)); break;
      case Op::kReadV:
      case Op::kWriteV: {
        TESSERA_RETURN_IF_ERROR(DecodeFixed<VectorRequest>(&f, payload));
        const auto& v = std::get<VectorRequest>(f.body);
        const char* name = h.op == Op::kReadV ? "READV" : "WRITEV";
        const size_t ranges = size_t{v.count} * VectorRange::kWireSize;
        if (f.data.size() < ranges) {
          return ProtocolError(name, ": ", v.count, " ranges need ", ranges, " bytes, ",
                               f.data.size(), " follow");
        }
        uint64_t sum = 0;
        for (uint32_t i = 0; i < v.count; ++i) {
          TESSERA_ASSIGN_OR_RETURN(
              VectorRange r,
              VectorRange::Decode(f.data.subspan(size_t{i} * VectorRange::kWireSize,
                                                 VectorRange::kWireSize)));
          if (r.offset + r.length < r.offset) {
            return ProtocolError(name, ": range ", i, " offset + length overflows");
          }
          sum += r.length;
        }
        if (sum != v.total_length) {
          return ProtocolError(name, ": total_length ", v.total_length, " but the ranges add up to ",
                               sum);
        }
        const size_t want = h.op == Op::kWriteV ? ranges + v.total_length : ranges;
        if (f.data.size() != want) {
          return ProtocolError(name, ": ", want - ranges, " data bytes expected after the ranges, ",
                               f.data.size() - ranges, " follow");
        }
        break;
      }
      case Op::kStats:
      case Op::kHeartbeat:
      case Op::kGoodbye:
      case Op::kNotice:
        f.data = payload;
        break;
      case Op::kKvGet: {
        TESSERA_RETURN_IF_ERROR(DecodeFixed<KvKeyRequest>(&f, payload));
        const auto& r = std::get<KvKeyRequest>(f.body);
        if (f.data.size() != r.key_len) {
          return ProtocolError("KV_GET: key_len ", r.key_len, " but ", f.data.size(),
                               " bytes follow");
        }
        break;
      }
      case Op::kKvMultiGet: {
        TESSERA_RETURN_IF_ERROR(DecodeFixed<KvMultiGetRequest>(&f, payload));
        TESSERA_RETURN_IF_ERROR(
            ParseKvMultiGetKeys(std::get<KvMultiGetRequest>(f.body), f.data).status());
        break;
      }
      case Op::kKvPut: {
        TESSERA_RETURN_IF_ERROR(DecodeFixed<KvPutRequest>(&f, payload));
        const auto& r = std::get<KvPutRequest>(f.body);
        if (f.data.size() != size_t{r.key_len} + r.value_len) {
          return ProtocolError("KV_PUT: key_len ", r.key_len, " + value_len ", r.value_len,
                               " but ", f.data.size(), " bytes follow");
        }
        break;
      }
      case Op::kKvDelete: {
        TESSERA_RETURN_IF_ERROR(DecodeFixed<KvDeleteRequest>(&f, payload));
        const auto& r = std::get<KvDeleteRequest>(f.body);
        if (f.data.size() != r.key_len) {
          return ProtocolError("KV_DELETE: key_len ", r.key_len, " but ", f.data.size(),
                               " bytes follow");
        }
        break;
      }
      case Op::kKvInvoke: TESSERA_RETURN_IF_ERROR(DecodeFixed<KvInvokeRequest>(&f, payload)); break;
      case Op::kKvCommit: {
        TESSERA_RETURN_IF_ERROR(DecodeFixed<KvCommitRequest>(&f, payload));
        TESSERA_RETURN_IF_ERROR(
            ParseKvCommitItems(std::get<KvCommitRequest>(f.body), f.data).status());
        break;
      }
    }
  } else {
    switch (h.op) {
      case Op::kHello: TESSERA_RETURN_IF_ERROR(DecodeFixed<ChallengeResponse>(&f, payload)); break;
      case Op::kAuth: TESSERA_RETURN_IF_ERROR(DecodeFixed<AuthOkResponse>(&f, payload)); break;
      case Op::kAllocSlab: TESSERA_RETURN_IF_ERROR(DecodeFixed<AllocSlabResponse>(&f, payload)); break;
      case Op::kHeartbeat: TESSERA_RETURN_IF_ERROR(DecodeFixed<HeartbeatResponse>(&f, payload)); break;
      case Op::kNotice: TESSERA_RETURN_IF_ERROR(DecodeFixed<Notice>(&f, payload)); break;
      case Op::kFreeSlab:
      case Op::kRead:
      case Op::kWrite:
      case Op::kReadV:
      case Op::kWriteV:
      case Op::kStats:
      case Op::kInvoke:
      case Op::kFault:
      case Op::kGoodbye:
        f.data = payload;
        break;
      case Op::kKvGet: {
        TESSERA_RETURN_IF_ERROR(DecodeFixed<KvValueHeader>(&f, payload));
        const auto& r = std::get<KvValueHeader>(f.body);
        if (r.version == 0) return ProtocolError("KV_GET response with version 0");
        if (f.data.size() != r.value_len) {
          return ProtocolError("KV_GET response: value_len ", r.value_len, " but ",
                               f.data.size(), " bytes follow");
        }
        break;
      }
      case Op::kKvMultiGet:
        TESSERA_RETURN_IF_ERROR(ParseKvMultiGetResponse(payload, 0).status());
        f.data = payload;
        break;
      case Op::kKvPut:
      case Op::kKvDelete:
      case Op::kKvCommit:
        TESSERA_RETURN_IF_ERROR(DecodeFixed<KvWriteResponse>(&f, payload));
        break;
      case Op::kKvInvoke: {
        TESSERA_RETURN_IF_ERROR(DecodeFixed<KvInvokeResponse>(&f, payload));
        if (std::get<KvInvokeResponse>(f.body).outcome == KvOutcome::kPushedBack &&
            !f.data.empty()) {
          return ProtocolError("KV_INVOKE response: pushed back with a result");
        }
        break;
      }
    }
  }
  return f;
}

}  // namespace tessera::fabric
