// The payloads of the control and data frames: handshake, slabs, one-sided and vector
// reads and writes, heartbeats, invokes, faults and notices.
#include "fabric/wire.h"

#include <cstring>

#include "fabric/wire_checks.h"

namespace tessera::fabric {

using wire_checks::CheckDataLength;
using wire_checks::CheckPad;
using wire_checks::Short;

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

}  // namespace tessera::fabric
