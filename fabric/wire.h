// The Tessera wire protocol: frames exchanged between a client Transport and a memory server.
//
// Every frame is a fixed 24-byte header followed by a payload whose layout is fixed per op:
//
//   offset size field
//   0      4    magic        "TSRA" (bytes 'T','S','R','A'; kMagic read little-endian)
//   4      2    version      kProtocolVersion (1)
//   6      2    op           Op; the high bit (kResponseBit) is set in server -> client frames
//   8      8    request_id   chosen by the client, echoed in the response; 0 in NOTICEs
//   16     4    status       StatusCode of a response; must be 0 in requests
//   20     4    payload_len  bytes after the header, <= kMaxPayloadLength
//
// All integers are little-endian. A response with a non-zero status carries only an error
// message (UTF-8 text, <= kMaxErrorMessageLength bytes) as its payload. Every payload struct
// below has a fixed wire size (kWireSize) and is checked for exact length on decode; variable
// data (READ response bytes, WRITE data, STATS text, INVOKE args/results) follows the fixed part
// and is bounded by kMaxDataLength. Padding fields must be zero; decoders reject anything else,
// so every accepted frame re-encodes to the same bytes.
//
// Handshake: HELLO -> CHALLENGE, AUTH -> AUTH_OK (see fabric/auth.h for the MACs). Before a
// successful AUTH the server accepts only HELLO and AUTH and closes the connection otherwise.
//
// Thread safety: all functions here are pure and may be called from any thread. Nothing here
// allocates except the std::vector/std::string returning helpers meant for the control path.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/coding.h"
#include "common/status.h"

namespace tessera::fabric {

inline constexpr uint32_t kMagic = 0x41525354;  // "TSRA" as little-endian bytes.
inline constexpr uint16_t kProtocolVersion = 1;
inline constexpr size_t kHeaderSize = 24;
// Largest READ/WRITE length, INVOKE argument/result and STATS text.
inline constexpr uint32_t kMaxDataLength = 4u << 20;
// Room for the fixed part of any payload in front of kMaxDataLength bytes.
inline constexpr uint32_t kMaxPayloadLength = kMaxDataLength + 4096;
inline constexpr uint32_t kMaxErrorMessageLength = 1024;
inline constexpr size_t kNonceSize = 32;
inline constexpr size_t kMacSize = 32;
inline constexpr size_t kMaxRdmaHostLength = 64;

inline constexpr uint16_t kResponseBit = 0x8000;

// Request ops. A response uses the same value with kResponseBit set (CHALLENGE is the response
// to HELLO, AUTH_OK the response to AUTH). NOTICE only travels server -> client, with
// kResponseBit set and request_id 0.
enum class Op : uint16_t {
  kHello = 1,
  kAuth = 2,
  kAllocSlab = 3,
  kFreeSlab = 4,
  kRead = 5,
  kWrite = 6,
  kStats = 7,
  kHeartbeat = 8,
  kInvoke = 9,
  kFault = 10,
  kNotice = 11,
  kGoodbye = 12,
  kReadV = 13,   // Vectored READ: several ranges, one request, one reply.
  kWriteV = 14,  // Vectored WRITE.
};
inline constexpr uint16_t kMaxOpValue = 14;  // Highest op of the contiguous 1.. block.
// 15 is unassigned. Ops kFirstServiceOp..kLastServiceOp are request types of the services a
// server hosts, each service defining their payloads in its own folder: the engine checks only
// that their payload fits in kMaxPayloadLength, hands the payload to the service registered for
// the op (fabric/server.h Server::RegisterService), and answers an op no service registered
// with an Unsupported error response. The service defines and validates the payload.
inline constexpr uint16_t kFirstServiceOp = 16;
inline constexpr uint16_t kLastServiceOp = 255;
inline bool IsServiceOp(Op op) {
  return static_cast<uint16_t>(op) >= kFirstServiceOp &&
         static_cast<uint16_t>(op) <= kLastServiceOp;
}

// "HELLO", "READ", ... ("SERVICE_OP(n)" for a service op, "UNKNOWN(n)" for other values).
std::string OpName(Op op);
bool IsKnownOp(uint16_t value);

enum class Direction : uint8_t {
  kRequest,   // client -> server: kResponseBit clear, status 0.
  kResponse,  // server -> client: kResponseBit set.
};

struct FrameHeader {
  Op op = Op::kHello;  // Without kResponseBit; the direction says which way it travels.
  bool response = false;
  uint64_t request_id = 0;
  StatusCode status = StatusCode::kOk;
  uint32_t payload_len = 0;
};

// Writes the 24-byte header to out[0..23].
void EncodeHeader(const FrameHeader& h, uint8_t* out);

// Decodes and validates a header: magic, version, a known op, the direction bit matching
// `expected`, status 0 in requests and a known StatusCode in responses, payload_len within
// kMaxPayloadLength and allowed for that op (exact size for fixed-layout payloads, bounded for
// variable ones, <= kMaxErrorMessageLength for error responses), request_id 0 for NOTICE.
// So a receiver can refuse a frame before reading its payload. ProtocolError on violation.
Result<FrameHeader> DecodeHeader(std::span<const uint8_t> bytes, Direction expected);

// ---- payloads ----------------------------------------------------------------------------
// Each struct: kWireSize (its fixed part), EncodeTo(out) writing kWireSize bytes, and
// Decode(bytes) requiring exactly kWireSize bytes (the caller splits off trailing data).

using Nonce = std::array<uint8_t, kNonceSize>;
using Mac = std::array<uint8_t, kMacSize>;

// HELLO may carry 8 more bytes after this body: the client process's instance id (non-zero),
// covered by both handshake MACs; the server then owns the connection's slabs as
// OwnerIdFor(client_id, instance_id) (fabric/auth.h, "Slab ownership").
struct HelloRequest {
  static constexpr size_t kWireSize = kNonceSize + 8 + 2 + 2;
  Nonce client_nonce{};
  uint64_t client_id = 0;  // Must be non-zero.
  uint16_t min_version = kProtocolVersion;
  uint16_t max_version = kProtocolVersion;  // >= min_version.
  void EncodeTo(uint8_t* out) const;
  static Result<HelloRequest> Decode(std::span<const uint8_t> b);
};

struct ChallengeResponse {
  static constexpr size_t kWireSize = kNonceSize + 8 + 2 + 2;
  Nonce server_nonce{};
  uint64_t server_id = 0;
  uint16_t version = kProtocolVersion;  // The version the server chose.
  // 2 bytes of zero padding on the wire.
  void EncodeTo(uint8_t* out) const;
  static Result<ChallengeResponse> Decode(std::span<const uint8_t> b);
};

struct AuthRequest {
  static constexpr size_t kWireSize = kMacSize;
  Mac client_mac{};  // fabric/auth.h ClientMac().
  void EncodeTo(uint8_t* out) const;
  static Result<AuthRequest> Decode(std::span<const uint8_t> b);
};

struct AuthOkResponse {
  static constexpr size_t kWireSize = kMacSize + 8 + 8 + 8 + 4 + 2 + 2 + kMaxRdmaHostLength;
  Mac server_mac{};         // fabric/auth.h ServerMac(): the client authenticates the server.
  uint64_t slab_size = 0;   // Default slab size in bytes.
  uint64_t capacity_bytes = 0;
  uint64_t rdma_token = 0;  // Sent back in the rdma_cm private data to bind the QP to this login.
  uint32_t flags = 0;       // kRdmaOffered.
  uint16_t rdma_port = 0;   // rdma_cm port when kRdmaOffered.
  // 2 bytes of zero padding.
  std::string rdma_host;    // <= kMaxRdmaHostLength bytes, NUL-padded on the wire.
  static constexpr uint32_t kRdmaOffered = 1;
  void EncodeTo(uint8_t* out) const;
  static Result<AuthOkResponse> Decode(std::span<const uint8_t> b);
};

struct AllocSlabRequest {
  static constexpr size_t kWireSize = 8;
  uint64_t size_hint = 0;  // 0: the server's default slab size.
  void EncodeTo(uint8_t* out) const;
  static Result<AllocSlabRequest> Decode(std::span<const uint8_t> b);
};

struct AllocSlabResponse {
  static constexpr size_t kWireSize = 8 + 8 + 8 + 4 + 4;
  uint64_t slab_id = 0;      // Non-zero.
  uint64_t size = 0;         // Bytes; READ/WRITE offsets are within [0, size).
  uint64_t remote_addr = 0;  // Address of the slab in the server's registered memory (RDMA).
  uint32_t rkey = 0;         // Remote key of that memory (0 when not registered with verbs).
  // 4 bytes of zero padding.
  void EncodeTo(uint8_t* out) const;
  static Result<AllocSlabResponse> Decode(std::span<const uint8_t> b);
};

struct FreeSlabRequest {
  static constexpr size_t kWireSize = 8;
  uint64_t slab_id = 0;
  void EncodeTo(uint8_t* out) const;
  static Result<FreeSlabRequest> Decode(std::span<const uint8_t> b);
};

// READ request payload. The response payload is exactly `length` bytes of slab data.
struct ReadRequest {
  static constexpr size_t kWireSize = 8 + 8 + 4 + 4;
  uint64_t slab_id = 0;
  uint64_t offset = 0;
  uint32_t length = 0;  // 1 .. kMaxDataLength.
  // 4 bytes of zero padding.
  void EncodeTo(uint8_t* out) const;
  static Result<ReadRequest> Decode(std::span<const uint8_t> b);
};

// WRITE request payload: this fixed part, then exactly `length` data bytes. Empty response.
struct WriteRequest {
  static constexpr size_t kWireSize = 8 + 8 + 4 + 4;
  uint64_t slab_id = 0;
  uint64_t offset = 0;
  uint32_t length = 0;  // 1 .. kMaxDataLength.
  // 4 bytes of zero padding.
  void EncodeTo(uint8_t* out) const;
  static Result<WriteRequest> Decode(std::span<const uint8_t> b);
};

// READV / WRITEV (coalescing: a client sends the small reads or writes it has for one server
// as one request). Request payload: this fixed part, then `count` VectorRange entries, then for
// WRITEV the data of every range back to back (total_length bytes). READV response payload: the
// data of every range back to back (total_length bytes); WRITEV response: empty. All or nothing:
// the server checks every range (ownership, bounds) before it reads or writes any of them, and a
// bad range fails the whole request with that range's error (nothing is written).
inline constexpr uint32_t kMaxVectorRanges = 128;
struct VectorRequest {
  static constexpr size_t kWireSize = 4 + 4;
  uint32_t count = 0;         // 1 .. kMaxVectorRanges.
  uint32_t total_length = 0;  // Sum of the ranges' lengths, 1 .. kMaxDataLength.
  void EncodeTo(uint8_t* out) const;
  static Result<VectorRequest> Decode(std::span<const uint8_t> b);
};
// One range of a READV/WRITEV; same layout as ReadRequest.
struct VectorRange {
  static constexpr size_t kWireSize = 8 + 8 + 4 + 4;
  uint64_t slab_id = 0;
  uint64_t offset = 0;
  uint32_t length = 0;  // 1 .. kMaxDataLength.
  // 4 bytes of zero padding.
  void EncodeTo(uint8_t* out) const;
  static Result<VectorRange> Decode(std::span<const uint8_t> b);
};
// The i-th range of a parsed READV/WRITEV (ParsedFrame::data starts with the ranges). Only for
// frames ParseFrame accepted (every range was validated there).
VectorRange VectorRangeAt(std::span<const uint8_t> data, uint32_t i);

struct HeartbeatResponse {
  static constexpr size_t kWireSize = 8 + 8 + 8 + 4 + 4 + 4 + 4;
  uint64_t server_time_ns = 0;  // Server's CLOCK_MONOTONIC.
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
  uint32_t slabs_used = 0;
  uint32_t slabs_free = 0;
  uint32_t load_permille = 0;   // Server load, 0..1000 (e.g. CPU busy fraction).
  uint32_t connections = 0;
  void EncodeTo(uint8_t* out) const;
  static Result<HeartbeatResponse> Decode(std::span<const uint8_t> b);
};

// INVOKE request payload: this fixed part, then the argument bytes. The response payload is the
// result bytes (<= kMaxDataLength).
struct InvokeRequest {
  static constexpr size_t kWireSize = 4 + 4;
  uint32_t function_id = 0;
  // 4 bytes of zero padding.
  void EncodeTo(uint8_t* out) const;
  static Result<InvokeRequest> Decode(std::span<const uint8_t> b);
};

enum class FaultAction : uint32_t {
  kClear = 0,            // Remove every injected fault.
  kDelay = 1,            // Delay replies by delay_us.
  kHang = 2,             // Never reply to matching ops.
  kDropConnection = 3,   // Close the connection of a matching op.
  kCrash = 4,            // The daemon exits abruptly (as if killed).
  kEvictSlabs = 5,       // Send eviction notices for `count` slabs, then evict them.
};
inline constexpr uint32_t kMaxFaultAction = 5;
std::string FaultActionName(FaultAction a);

// FAULT request payload (authenticated clients only). Empty response.
struct FaultRequest {
  static constexpr size_t kWireSize = 4 + 4 + 8 + 8 + 8;
  FaultAction action = FaultAction::kClear;
  // Bit (1 << op value) selects the ops the fault applies to; 0 means READ and WRITE.
  uint32_t op_mask = 0;
  uint64_t delay_us = 0;     // kDelay.
  uint64_t duration_ms = 0;  // How long the fault lasts; 0: until cleared.
  uint64_t count = 0;        // kEvictSlabs: how many slabs.
  void EncodeTo(uint8_t* out) const;
  static Result<FaultRequest> Decode(std::span<const uint8_t> b);
};

enum class NoticeKind : uint32_t {
  kSlabEvicting = 1,   // slab_id will be evicted at deadline; move its data elsewhere.
  kShuttingDown = 2,   // The server is going away; the connection closes after this.
};
inline constexpr uint32_t kMaxNoticeKind = 2;

// NOTICE payload (server -> client push, request_id 0).
struct Notice {
  static constexpr size_t kWireSize = 4 + 4 + 8 + 8;
  NoticeKind kind = NoticeKind::kShuttingDown;
  // 4 bytes of zero padding.
  uint64_t slab_id = 0;      // kSlabEvicting: the slab (non-zero); else 0.
  uint64_t deadline_ms = 0;  // Milliseconds from sending until the event happens.
  void EncodeTo(uint8_t* out) const;
  static Result<Notice> Decode(std::span<const uint8_t> b);
};

// ---- whole frames (control path, tests, fuzzing) -------------------------------------------

// A fully validated frame. `body` is the decoded fixed part (monostate for ops without one);
// `data` views the variable bytes that follow it inside the parsed buffer (READ response data,
// WRITE data, STATS text, INVOKE args/result, an error message, a service op's whole payload;
// READV/WRITEV requests: the ranges, then the WRITEV data).
struct ParsedFrame {
  FrameHeader header;
  std::variant<std::monostate, HelloRequest, ChallengeResponse, AuthRequest, AuthOkResponse,
               AllocSlabRequest, AllocSlabResponse, FreeSlabRequest, ReadRequest, WriteRequest,
               HeartbeatResponse, InvokeRequest, FaultRequest, Notice, VectorRequest>
      body;
  std::span<const uint8_t> data;
  size_t frame_size = 0;  // kHeaderSize + payload_len.
};

// Parses one frame at the start of `bytes`. Unavailable (not an error of the peer) when more
// bytes are needed; ProtocolError for malformed input. Checks everything DecodeHeader does plus
// the payload layout (e.g. a WRITE's payload_len must equal kWireSize + length).
Result<ParsedFrame> ParseFrame(std::span<const uint8_t> bytes, Direction direction);

// Builds a complete frame: header (payload_len computed) + fixed part + data.
template <typename Body>
std::vector<uint8_t> BuildFrame(FrameHeader h, const Body& body,
                                std::span<const uint8_t> data = {}) {
  std::vector<uint8_t> out(kHeaderSize + Body::kWireSize + data.size());
  h.payload_len = static_cast<uint32_t>(Body::kWireSize + data.size());
  EncodeHeader(h, out.data());
  body.EncodeTo(out.data() + kHeaderSize);
  if (!data.empty()) std::copy(data.begin(), data.end(), out.begin() + kHeaderSize + Body::kWireSize);
  return out;
}
// A frame whose payload is only `data` (or empty): STATS, GOODBYE, error responses, ...
std::vector<uint8_t> BuildRawFrame(FrameHeader h, std::span<const uint8_t> data = {});

// A 32-bit field at a known offset of a built frame (the header's payload_len, a payload's
// first field), for tests that patch a frame into a malformed one or peek at a length. The
// encoders and parsers write and read every field with common/coding.h's cursors instead.
inline void PutU32(uint8_t* p, uint32_t v) { EncodeFixed32(p, v); }
inline uint32_t GetU32(const uint8_t* p) { return DecodeFixed32(p); }

}  // namespace tessera::fabric
