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
  SpanWriter(out, kWireSize)
      .PutBytes(client_nonce)
      .PutFixed64(client_id)
      .PutFixed16(min_version)
      .PutFixed16(max_version);
}
Result<HelloRequest> HelloRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("HELLO", kWireSize, b.size());
  HelloRequest r;
  SpanReader in(b);
  std::memcpy(r.client_nonce.data(), in.GetBytes(kNonceSize, "client nonce").data(), kNonceSize);
  r.client_id = in.GetFixed64("client_id");
  r.min_version = in.GetFixed16("min_version");
  r.max_version = in.GetFixed16("max_version");
  if (r.client_id == 0) return ProtocolError("HELLO: client_id must be non-zero");
  if (r.min_version == 0 || r.min_version > r.max_version) {
    return ProtocolError("HELLO: bad version range ", r.min_version, "..", r.max_version);
  }
  return r;
}

void ChallengeResponse::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize)
      .PutBytes(server_nonce)
      .PutFixed64(server_id)
      .PutFixed16(version)
      .PutZeros(2);
}
Result<ChallengeResponse> ChallengeResponse::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("CHALLENGE", kWireSize, b.size());
  ChallengeResponse r;
  SpanReader in(b);
  std::memcpy(r.server_nonce.data(), in.GetBytes(kNonceSize, "server nonce").data(), kNonceSize);
  r.server_id = in.GetFixed64("server_id");
  r.version = in.GetFixed16("version");
  TESSERA_RETURN_IF_ERROR(CheckPad("CHALLENGE", in.GetBytes(2, "padding").data(), 2));
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
  const size_t host = std::min(rdma_host.size(), kMaxRdmaHostLength);
  SpanWriter(out, kWireSize)
      .PutBytes(server_mac)
      .PutFixed64(slab_size)
      .PutFixed64(capacity_bytes)
      .PutFixed64(rdma_token)
      .PutFixed32(flags)
      .PutFixed16(rdma_port)
      .PutZeros(2)
      .PutBytes({reinterpret_cast<const uint8_t*>(rdma_host.data()), host})
      .PutZeros(kMaxRdmaHostLength - host);
}
Result<AuthOkResponse> AuthOkResponse::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("AUTH_OK", kWireSize, b.size());
  SpanReader in(b);
  AuthOkResponse r;
  std::memcpy(r.server_mac.data(), in.GetBytes(kMacSize, "server mac").data(), kMacSize);
  r.slab_size = in.GetFixed64("slab_size");
  r.capacity_bytes = in.GetFixed64("capacity_bytes");
  r.rdma_token = in.GetFixed64("rdma_token");
  r.flags = in.GetFixed32("flags");
  r.rdma_port = in.GetFixed16("rdma_port");
  TESSERA_RETURN_IF_ERROR(CheckPad("AUTH_OK", in.GetBytes(2, "padding").data(), 2));
  if ((r.flags & ~kRdmaOffered) != 0) return ProtocolError("AUTH_OK: unknown flags ", r.flags);
  const uint8_t* host = in.GetBytes(kMaxRdmaHostLength, "rdma_host").data();
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

void AllocSlabRequest::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize).PutFixed64(size_hint);
}
Result<AllocSlabRequest> AllocSlabRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("ALLOC_SLAB", kWireSize, b.size());
  AllocSlabRequest r;
  r.size_hint = SpanReader(b).GetFixed64("size_hint");
  return r;
}

void AllocSlabResponse::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize)
      .PutFixed64(slab_id)
      .PutFixed64(size)
      .PutFixed64(remote_addr)
      .PutFixed32(rkey)
      .PutZeros(4);
}
Result<AllocSlabResponse> AllocSlabResponse::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("ALLOC_SLAB response", kWireSize, b.size());
  AllocSlabResponse r;
  SpanReader in(b);
  r.slab_id = in.GetFixed64("slab_id");
  r.size = in.GetFixed64("size");
  r.remote_addr = in.GetFixed64("remote_addr");
  r.rkey = in.GetFixed32("rkey");
  TESSERA_RETURN_IF_ERROR(CheckPad("ALLOC_SLAB response", in.GetBytes(4, "padding").data(), 4));
  if (r.slab_id == 0) return ProtocolError("ALLOC_SLAB response: slab_id must be non-zero");
  if (r.size == 0) return ProtocolError("ALLOC_SLAB response: size must be non-zero");
  if (r.remote_addr + r.size < r.remote_addr) {
    return ProtocolError("ALLOC_SLAB response: remote_addr + size overflows");
  }
  return r;
}

void FreeSlabRequest::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize).PutFixed64(slab_id);
}
Result<FreeSlabRequest> FreeSlabRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("FREE_SLAB", kWireSize, b.size());
  FreeSlabRequest r;
  r.slab_id = SpanReader(b).GetFixed64("slab_id");
  if (r.slab_id == 0) return ProtocolError("FREE_SLAB: slab_id must be non-zero");
  return r;
}

namespace {
template <typename T>
void EncodeRw(const T& r, uint8_t* out) {
  SpanWriter(out, T::kWireSize)
      .PutFixed64(r.slab_id)
      .PutFixed64(r.offset)
      .PutFixed32(r.length)
      .PutZeros(4);
}
template <typename T>
Result<T> DecodeRw(const char* what, std::span<const uint8_t> b) {
  if (b.size() != T::kWireSize) return Short(what, T::kWireSize, b.size());
  T r;
  SpanReader in(b);
  r.slab_id = in.GetFixed64("slab_id");
  r.offset = in.GetFixed64("offset");
  r.length = in.GetFixed32("length");
  TESSERA_RETURN_IF_ERROR(CheckPad(what, in.GetBytes(4, "padding").data(), 4));
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
  SpanReader in(data.subspan(size_t{i} * VectorRange::kWireSize, VectorRange::kWireSize));
  VectorRange r;
  r.slab_id = in.GetFixed64("slab_id");
  r.offset = in.GetFixed64("offset");
  r.length = in.GetFixed32("length");
  return r;
}

void VectorRequest::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize).PutFixed32(count).PutFixed32(total_length);
}
Result<VectorRequest> VectorRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("vector request", kWireSize, b.size());
  VectorRequest v;
  SpanReader in(b);
  v.count = in.GetFixed32("count");
  v.total_length = in.GetFixed32("total_length");
  if (v.count == 0 || v.count > kMaxVectorRanges) {
    return ProtocolError("vector request: count ", v.count, " outside 1..", kMaxVectorRanges);
  }
  TESSERA_RETURN_IF_ERROR(CheckDataLength("vector request total", v.total_length));
  return v;
}

void HeartbeatResponse::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize)
      .PutFixed64(server_time_ns)
      .PutFixed64(free_bytes)
      .PutFixed64(total_bytes)
      .PutFixed32(slabs_used)
      .PutFixed32(slabs_free)
      .PutFixed32(load_permille)
      .PutFixed32(connections);
}
Result<HeartbeatResponse> HeartbeatResponse::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("HEARTBEAT response", kWireSize, b.size());
  SpanReader in(b);
  HeartbeatResponse r;
  r.server_time_ns = in.GetFixed64("server_time_ns");
  r.free_bytes = in.GetFixed64("free_bytes");
  r.total_bytes = in.GetFixed64("total_bytes");
  r.slabs_used = in.GetFixed32("slabs_used");
  r.slabs_free = in.GetFixed32("slabs_free");
  r.load_permille = in.GetFixed32("load_permille");
  r.connections = in.GetFixed32("connections");
  if (r.free_bytes > r.total_bytes) {
    return ProtocolError("HEARTBEAT: free_bytes ", r.free_bytes, " > total_bytes ", r.total_bytes);
  }
  if (r.load_permille > 1000)
    return ProtocolError("HEARTBEAT: load_permille ", r.load_permille, " > 1000");
  return r;
}

void InvokeRequest::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize).PutFixed32(function_id).PutZeros(4);
}
Result<InvokeRequest> InvokeRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("INVOKE", kWireSize, b.size());
  InvokeRequest r;
  SpanReader in(b);
  r.function_id = in.GetFixed32("function_id");
  TESSERA_RETURN_IF_ERROR(CheckPad("INVOKE", in.GetBytes(4, "padding").data(), 4));
  return r;
}

void FaultRequest::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize)
      .PutFixed32(static_cast<uint32_t>(action))
      .PutFixed32(op_mask)
      .PutFixed64(delay_us)
      .PutFixed64(duration_ms)
      .PutFixed64(count);
}
Result<FaultRequest> FaultRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("FAULT", kWireSize, b.size());
  SpanReader in(b);
  uint32_t action = in.GetFixed32("action");
  if (action > kMaxFaultAction) return ProtocolError("FAULT: unknown action ", action);
  FaultRequest r;
  r.action = static_cast<FaultAction>(action);
  r.op_mask = in.GetFixed32("op_mask");
  r.delay_us = in.GetFixed64("delay_us");
  r.duration_ms = in.GetFixed64("duration_ms");
  r.count = in.GetFixed64("count");
  uint32_t valid_mask = ((1u << (kMaxOpValue + 1)) - 1) & ~1u;
  if ((r.op_mask & ~valid_mask) != 0) return ProtocolError("FAULT: op_mask has unknown op bits");
  if (r.delay_us > 3600ull * 1000000) return ProtocolError("FAULT: delay_us above one hour");
  if (r.action == FaultAction::kDelay && r.delay_us == 0) {
    return ProtocolError("FAULT: delay action needs delay_us > 0");
  }
  return r;
}

void Notice::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize)
      .PutFixed32(static_cast<uint32_t>(kind))
      .PutZeros(4)
      .PutFixed64(slab_id)
      .PutFixed64(deadline_ms);
}
Result<Notice> Notice::Decode(std::span<const uint8_t> b) {
  if (b.size() != kWireSize) return Short("NOTICE", kWireSize, b.size());
  SpanReader in(b);
  uint32_t kind = in.GetFixed32("kind");
  if (kind == 0 || kind > kMaxNoticeKind) return ProtocolError("NOTICE: unknown kind ", kind);
  Notice n;
  n.kind = static_cast<NoticeKind>(kind);
  TESSERA_RETURN_IF_ERROR(CheckPad("NOTICE", in.GetBytes(4, "padding").data(), 4));
  n.slab_id = in.GetFixed64("slab_id");
  n.deadline_ms = in.GetFixed64("deadline_ms");
  if (n.kind == NoticeKind::kSlabEvicting && n.slab_id == 0) {
    return ProtocolError("NOTICE: slab eviction without a slab_id");
  }
  if (n.kind == NoticeKind::kShuttingDown && n.slab_id != 0) {
    return ProtocolError("NOTICE: shutdown notice with a slab_id");
  }
  return n;
}

}  // namespace tessera::fabric
