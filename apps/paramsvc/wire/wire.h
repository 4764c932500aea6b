// The Parameter Service wire protocol (its own, beside the fabric's: page traffic and model
// aggregation do not share a socket or a process; see apps/paramsvc/server/server.h).
//
// Every message is a 24-byte header followed by `payload_len` bytes, little-endian:
//   u32 magic 'TPSV' | u8 version (1) | u8 op | u16 status (replies; 0 in requests)
//   u32 payload_len (<= kMaxPayload) | u32 job (0: none) | u64 request_id
// A reply carries the request's op and request_id. A reply with status != 0 carries the error
// message as its payload, except status kStatusMoved (256, outside StatusCode): the request's
// job lives on another server now and the payload is that server's "HOST:PORT"; the request
// was not applied here (see "Moves between servers" in server.h). kStatusArriving (257): the
// job is arriving here by a move not committed yet; not applied, send it again shortly. Every field of every message is checked by the Decode functions
// below (a frame that fails them gets a ProtocolError/InvalidArgument reply naming the field,
// and a frame whose header is bad closes the connection: its length cannot be trusted).
//
// A connection starts with the fabric's mutual HMAC handshake (fabric/auth.h): HELLO
// {client_nonce, client_id} -> {server_nonce, server_id}; AUTH {ClientMac} -> {ServerMac}.
// No other op is accepted before AUTH succeeds.
//
// Thread safety: pure functions over values.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "apps/paramsvc/kernels.h"
#include "common/coding.h"
#include "common/status.h"

namespace tessera::paramsvc {

inline constexpr uint32_t kMagic = 0x56535054;  // "TPSV"
inline constexpr uint8_t kWireVersion = 1;
inline constexpr size_t kHeaderSize = 24;
inline constexpr uint32_t kMaxPayload = (64u << 20) + 4096;  // A 64 MiB partition plus fields.
inline constexpr uint32_t kMaxPartitionBytes = 64u << 20;
// A partition's whole state (parameters, two optimizer buffers, counters): IMPORT_PART,
// PUT_STATE and GET_STATE's reply.
inline constexpr uint32_t kMaxStatePayload = 3 * kMaxPartitionBytes + (64u << 10);
// The reply status of a request whose job moved to another server (payload "HOST:PORT").
inline constexpr uint16_t kStatusMoved = 256;
// The reply status of a request for a job that is arriving here by a move not committed yet
// (payload: a message); the request was not applied: send it again shortly.
inline constexpr uint16_t kStatusArriving = 257;
inline constexpr uint32_t kMaxWorkers = 1024;
inline constexpr uint32_t kMaxTensors = 65536;
inline constexpr uint64_t kMaxModelBytes = 16ull << 30;
inline constexpr size_t kMaxNameLength = 256;

enum class Op : uint8_t {
  kError = 0,      // Reply only (status != 0): a connection-level error; the server then closes
  kHello = 1,
  kAuth = 2,
  kRegister = 3,   // JobSpec -> JobLayout (joins the job when one of that name and spec exists)
  kPush = 4,       // PushRequest -> PushReply
  kPull = 5,       // PullRequest -> PullReply
  kBarrier = 6,    // BarrierRequest -> empty
  kStatus = 7,     // empty -> JSON text (see Server::StatusJson)
  kSetParams = 8,  // SetParamsRequest -> empty (initial values; only before the first update)
  kRelease = 9,    // empty (job in header) -> empty: the job departs, its state is freed
  kMigrate = 10,   // MigrateRequest -> empty: move a partition to a core at its next boundary
  kCores = 11,     // CoresRequest -> empty: change the service's core budget
  kSetLr = 12,     // SetLrRequest -> empty: the job's learning rate from its next round on
  // Moves between servers (admin credentials only; server.h "Moves between servers").
  kMoveJob = 13,       // MoveJobRequest -> JSON report: move a job to another server (operator)
  kImportBegin = 14,   // ImportBegin -> u32 job: a staged copy of a job arriving (server to server)
  kImportPart = 15,    // ImportPart -> empty: one partition's state into the staged copy
  kImportPrepare = 16, // ImportPrepare -> u8 durable: the staged copy is complete and persisted
  kImportCommit = 17,  // MoveRef -> empty: the staged copy becomes the job
  kImportAbort = 18,   // MoveRef -> empty: the staged copy is dropped
  kMoveStatus = 19,    // MoveRef -> u8 MoveState: what the source decided (destination asks)
  kDrain = 20,         // DrainRequest -> empty: new jobs go elsewhere (operator)
  // A job's optimizer state (e.g. a PyTorch state_dict).
  kGetState = 21,      // u32 partition -> PartitionState bytes (server.h)
  kPutState = 22,      // u32 partition + PartitionState bytes -> empty: at an iteration boundary
};
const char* OpName(uint8_t op);
// The largest payload a frame of `op` may carry (kMaxStatePayload for the state ops).
uint32_t MaxPayload(uint8_t op);

struct Header {
  uint8_t op = 0;
  uint16_t status = 0;
  uint32_t payload_len = 0;
  uint32_t job = 0;
  uint64_t request_id = 0;
};
void EncodeHeader(const Header& h, uint8_t* out);
// ProtocolError for a bad magic, version, unknown op or oversized payload.
Result<Header> DecodeHeader(std::span<const uint8_t> bytes);

enum class Mode : uint8_t { kSync = 0, kAsync = 1, kBounded = 2 };
enum class LatePolicy : uint8_t { kDrop = 0, kAggregate = 1 };
// kAverage: no optimizer; a round's result is the averaged gradient itself (the values a pull
// returns), which makes the service a reducer, e.g. for a DDP communication hook.
enum class OptimizerKind : uint8_t { kSgd = 0, kAdam = 1, kAverage = 2 };
const char* ModeName(Mode m);
// "sync", "async", "bounded(s)" / "bounded:s" -> mode and s.
Result<std::pair<Mode, uint32_t>> ParseMode(std::string_view text);

struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<uint64_t> shape;  // 1..8 dims, each >= 1
  uint64_t elements() const;
};

struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::kSgd;
  float lr = 0.01f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
};

struct JobSpec {
  std::string name;  // 1..256 bytes, unique per service
  uint32_t workers = 1;
  Mode mode = Mode::kSync;
  uint32_t staleness = 0;  // s of bounded(s)
  LatePolicy late = LatePolicy::kDrop;
  OptimizerSpec optimizer;
  uint32_t partition_bytes = 4u <<20;  // Upper bound of a partition's fp32 size (4 KiB..64 MiB)
  std::vector<TensorSpec> tensors;

  std::vector<uint8_t> Encode() const;
  static Result<JobSpec> Decode(std::span<const uint8_t> b);
  // Every field in range (what Decode checks after parsing); also used by clients.
  Status Validate() const;
  bool SameModel(const JobSpec& o) const;  // Same tensors, workers, mode and optimizer.
};

struct PartitionInfo {
  uint32_t tensor = 0;
  uint64_t offset = 0;  // First element within the tensor
  uint32_t count = 0;   // Elements
};
// Splits the spec's tensors into partitions of at most partition_bytes / 4 elements.
std::vector<PartitionInfo> PartitionModel(const JobSpec& spec);

struct JobLayout {
  uint32_t job = 0;
  std::vector<PartitionInfo> partitions;
  std::vector<uint8_t> Encode() const;
  static Result<JobLayout> Decode(std::span<const uint8_t> b);
};

struct PushRequest {
  static constexpr size_t kFixed = 4 + 4 + 8 + 1 + 3 + 4;
  uint32_t worker = 0;
  uint32_t partition = 0;
  uint64_t version = 0;  // Model version the gradient was computed on
  DType dtype = DType::kF32;
  uint32_t count = 0;
  std::span<const uint8_t> data;  // count * DTypeSize(dtype) bytes (a view into the frame)
  void EncodeFixed(uint8_t* out) const;
  static Result<PushRequest> Decode(std::span<const uint8_t> b);
};

enum class PushOutcome : uint8_t {
  kPending = 0,     // Added to the current round (sync/bounded): applied when the round closes
  kApplied = 1,     // Applied now (async, or it closed its round)
  kDropped = 2,     // Bounded mode: staleness > s and late policy drop
  kLateQueued = 3,  // Bounded mode: staleness > s, aggregated with other late pushes
};
struct PushReply {
  static constexpr size_t kWireSize = 1 + 3 + 4 + 8;
  PushOutcome outcome = PushOutcome::kPending;
  uint32_t staleness = 0;
  uint64_t version = 0;  // The partition's version after this push
  void EncodeTo(uint8_t* out) const;
  static Result<PushReply> Decode(std::span<const uint8_t> b);
};

struct PullRequest {
  static constexpr size_t kWireSize = 4 + 1 + 3 + 8 + 4;
  uint32_t partition = 0;
  DType dtype = DType::kF32;   // The dtype to return (the tensor's, or fp32)
  uint64_t min_version = 0;    // Wait until the partition's version reaches this
  uint32_t timeout_ms = 0;     // Bound of that wait (<= 600000)
  void EncodeTo(uint8_t* out) const;
  static Result<PullRequest> Decode(std::span<const uint8_t> b);
};
struct PullReply {
  static constexpr size_t kFixed = 8 + 4 + 1 + 3;
  uint64_t version = 0;
  uint32_t count = 0;
  DType dtype = DType::kF32;
  std::span<const uint8_t> data;
  static Result<PullReply> Decode(std::span<const uint8_t> b);
};

struct BarrierRequest {
  static constexpr size_t kWireSize = 4 + 4 + 8;
  uint32_t worker = 0;
  uint32_t timeout_ms = 0;
  uint64_t iteration = 0;
  void EncodeTo(uint8_t* out) const;
  static Result<BarrierRequest> Decode(std::span<const uint8_t> b);
};

struct SetParamsRequest {
  static constexpr size_t kFixed = 4 + 1 + 3 + 4;
  uint32_t partition = 0;
  DType dtype = DType::kF32;
  uint32_t count = 0;
  std::span<const uint8_t> data;
  void EncodeFixed(uint8_t* out) const;
  static Result<SetParamsRequest> Decode(std::span<const uint8_t> b);
};

struct MigrateRequest {
  static constexpr size_t kWireSize = 8;
  uint32_t partition = 0;
  uint32_t core = 0;
  void EncodeTo(uint8_t* out) const;
  static Result<MigrateRequest> Decode(std::span<const uint8_t> b);
};

// A learning-rate schedule's new value (e.g. torch.optim.lr_scheduler): every partition of
// the job uses it for the rounds that close after the request; finite and >= 0.
struct SetLrRequest {
  static constexpr size_t kWireSize = 4;
  float lr = 0.0f;
  void EncodeTo(uint8_t* out) const;
  static Result<SetLrRequest> Decode(std::span<const uint8_t> b);
};

// Moves between servers (server.h).
struct MoveJobRequest {
  std::string job;                     // The job's name
  std::string to;                      // Destination "HOST:PORT"
  uint32_t boundary_timeout_ms = 30000;  // Bound on waiting for an iteration boundary (100..600000)
  bool allow_volatile = false;         // Move to a destination without checkpoints
  std::vector<uint8_t> Encode() const;
  static Result<MoveJobRequest> Decode(std::span<const uint8_t> b);
};

struct ImportBegin {
  uint64_t move_id = 0;   // Non-zero, chosen by the source
  std::string source;     // The source's advertised "HOST:PORT" (asked with MOVE_STATUS)
  JobSpec spec;
  std::vector<uint8_t> Encode() const;
  static Result<ImportBegin> Decode(std::span<const uint8_t> b);
};

struct ImportPart {
  uint64_t move_id = 0;
  uint32_t partition = 0;
  std::span<const uint8_t> state;     // EncodePartitionState (server.h)
  std::span<const uint8_t> counters;  // EncodeCounters (server.h)
  static std::vector<uint8_t> EncodeFixed(uint64_t move_id, uint32_t partition,
                                          uint32_t state_len);
  static Result<ImportPart> Decode(std::span<const uint8_t> b);
};

struct ImportPrepare {
  static constexpr size_t kWireSize = 8 + 4 + 8;
  uint64_t move_id = 0;
  float lr = 0.0f;        // The job's current learning rate (SET_LR)
  uint64_t moves = 0;     // Moves the job made so far, this one included
  void EncodeTo(uint8_t* out) const;
  static Result<ImportPrepare> Decode(std::span<const uint8_t> b);
};

// Names one move: IMPORT_COMMIT, IMPORT_ABORT, MOVE_STATUS.
struct MoveRef {
  uint64_t move_id = 0;
  std::string job;  // The job's name
  std::vector<uint8_t> Encode() const;
  static Result<MoveRef> Decode(std::span<const uint8_t> b);
};
// MOVE_STATUS's answer: what the source knows of a move.
enum class MoveState : uint8_t {
  kUnknown = 0,    // Never decided to commit it (aborted, or forgotten by a restart): drop it
  kPending = 1,    // Still under way: ask again
  kCommitted = 2,  // The job belongs to the destination: activate it
};

struct DrainRequest {
  bool on = true;
  std::string redirect;  // "HOST:PORT" new jobs are sent to; empty: refused (Unavailable)
  std::vector<uint8_t> Encode() const;
  static Result<DrainRequest> Decode(std::span<const uint8_t> b);
};

// "HOST:PORT" (or "[v6]:PORT"), as an endpoint text of a move or a redirect; InvalidArgument
// when it is not one.
Status CheckEndpointText(std::string_view text, const char* what);

struct CoresRequest {
  static constexpr size_t kWireSize = 8;
  uint32_t max_cores = 0;  // 1..256
  uint32_t elastic = 1;    // 0: keep max_cores active (a static server), 1: pack
  void EncodeTo(uint8_t* out) const;
  static Result<CoresRequest> Decode(std::span<const uint8_t> b);
};

}  // namespace tessera::paramsvc
