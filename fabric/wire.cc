#include "fabric/wire.h"

#include <cstring>

#include "fabric/wire_checks.h"

namespace tessera::fabric {
namespace {

using wire_checks::CheckDataLength;
using wire_checks::CheckPad;
using wire_checks::Short;


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
  }
  if (IsServiceOp(op)) return {0, kMaxPayloadLength};  // The service checks the layout.
  return {1, 0};
}
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
  }
  if (IsServiceOp(op)) return {0, kMaxPayloadLength};  // The service checks the layout.
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
  }
  if (IsServiceOp(op)) return "SERVICE_OP(" + std::to_string(static_cast<unsigned>(op)) + ")";
  return "UNKNOWN(" + std::to_string(static_cast<unsigned>(op)) + ")";
}

bool IsKnownOp(uint16_t value) {
  return (value >= 1 && value <= kMaxOpValue) ||
         (value >= kFirstServiceOp && value <= kLastServiceOp);
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
  SpanWriter(out, kHeaderSize)
      .PutFixed32(kMagic)
      .PutFixed16(kProtocolVersion)
      .PutFixed16(
          static_cast<uint16_t>(static_cast<uint16_t>(h.op) | (h.response ? kResponseBit : 0)))
      .PutFixed64(h.request_id)
      .PutFixed32(static_cast<uint32_t>(h.status))
      .PutFixed32(h.payload_len);
}

Result<FrameHeader> DecodeHeader(std::span<const uint8_t> b, Direction expected) {
  if (b.size() < kHeaderSize) {
    return ProtocolError("frame header needs ", kHeaderSize, " bytes, got ", b.size());
  }
  SpanReader in(b.first(kHeaderSize));
  uint32_t magic = in.GetFixed32("magic");
  if (magic != kMagic) return ProtocolError("bad magic 0x", std::hex, magic);
  uint16_t version = in.GetFixed16("version");
  if (version != kProtocolVersion) {
    return ProtocolError("unsupported protocol version ", version, " (want ", kProtocolVersion, ")");
  }
  uint16_t raw_op = in.GetFixed16("op");
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
  h.request_id = in.GetFixed64("request_id");
  uint32_t status = in.GetFixed32("status");
  h.payload_len = in.GetFixed32("payload_len");
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
  return wire_checks::DecodeFixedPart<T>(OpName(f->header.op), payload, f);
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
  if (IsServiceOp(h.op)) {
    f.data = payload;  // Its layout is the service's (fabric/server.h ServiceHandler).
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
    }
  }
  return f;
}

}  // namespace tessera::fabric
