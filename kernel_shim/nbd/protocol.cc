#include "kernel_shim/nbd/protocol.h"

#include <cstdio>

#include "common/coding.h"

namespace tessera::nbd {

// The byte helpers the tests' raw NBD client uses: the common codec's, in network order.
void PutU16(std::string* out, uint16_t v) {
  uint8_t b[2];
  EncodeBigEndian16(b, v);
  out->append(reinterpret_cast<const char*>(b), 2);
}
void PutU32(std::string* out, uint32_t v) {
  uint8_t b[4];
  EncodeBigEndian32(b, v);
  out->append(reinterpret_cast<const char*>(b), 4);
}
void PutU64(std::string* out, uint64_t v) {
  uint8_t b[8];
  EncodeBigEndian64(b, v);
  out->append(reinterpret_cast<const char*>(b), 8);
}
uint16_t GetU16(const uint8_t* p) { return DecodeBigEndian16(p); }
uint32_t GetU32(const uint8_t* p) { return DecodeBigEndian32(p); }
uint64_t GetU64(const uint8_t* p) { return DecodeBigEndian64(p); }

std::string EncodeGreeting(uint16_t handshake_flags) {
  ByteWriter w;
  w.PutBigEndian64(kNbdMagic).PutBigEndian64(kIHaveOpt).PutBigEndian16(handshake_flags);
  return w.TakeString();
}

std::string EncodeOptionReply(uint32_t option, uint32_t type, std::string_view data) {
  ByteWriter w;
  w.PutBigEndian64(kOptReplyMagic).PutBigEndian32(option).PutBigEndian32(type);
  w.PutBigEndian32(static_cast<uint32_t>(data.size())).PutBytes(data);
  return w.TakeString();
}

std::string EncodeServerReplyData(std::string_view name, std::string_view description) {
  ByteWriter w;
  w.PutBigEndian32(static_cast<uint32_t>(name.size())).PutBytes(name).PutBytes(description);
  return w.TakeString();
}

std::string EncodeInfoExport(uint64_t size, uint16_t transmission_flags) {
  ByteWriter w;
  w.PutBigEndian16(kInfoExport).PutBigEndian64(size).PutBigEndian16(transmission_flags);
  return w.TakeString();
}

std::string EncodeInfoName(std::string_view name) {
  ByteWriter w;
  w.PutBigEndian16(kInfoName).PutBytes(name);
  return w.TakeString();
}

std::string EncodeInfoDescription(std::string_view description) {
  ByteWriter w;
  w.PutBigEndian16(kInfoDescription).PutBytes(description);
  return w.TakeString();
}

std::string EncodeInfoBlockSize(uint32_t minimum, uint32_t preferred, uint32_t maximum) {
  ByteWriter w;
  w.PutBigEndian16(kInfoBlockSize).PutBigEndian32(minimum).PutBigEndian32(preferred);
  w.PutBigEndian32(maximum);
  return w.TakeString();
}

Result<InfoRequest> DecodeInfoRequest(std::string_view payload) {
  const size_t n = payload.size();
  if (n < 6) return ProtocolError("info request of ", n, " bytes is shorter than 6");
  SpanReader r(AsBytes(payload));
  const uint32_t name_len = r.GetBigEndian32("export name length");
  if (name_len > n - 6) {
    return ProtocolError("info request names ", name_len, " bytes of export name but carries ",
                         n - 6);
  }
  InfoRequest req;
  const auto name = r.GetBytes(name_len, "export name");
  req.name.assign(reinterpret_cast<const char*>(name.data()), name.size());
  const uint16_t count = r.GetBigEndian16("information type count");
  if (static_cast<size_t>(count) * 2 != r.left()) {
    return ProtocolError("info request lists ", count, " information types in ", r.left(),
                         " bytes");
  }
  for (uint16_t i = 0; i < count; ++i) req.info_types.push_back(r.GetBigEndian16("information type"));
  TESSERA_RETURN_IF_ERROR(r.Finish("info request"));
  return req;
}

Result<RequestHeader> DecodeRequestHeader(const uint8_t* b) {
  SpanReader r(std::span<const uint8_t>(b, kRequestHeaderSize));
  const uint32_t magic = r.GetBigEndian32("request magic");
  if (magic != kRequestMagic) {
    return ProtocolError("bad request magic 0x", [magic] {
      char buf[16];
      std::snprintf(buf, sizeof buf, "%08x", magic);
      return std::string(buf);
    }());
  }
  RequestHeader h;
  h.flags = r.GetBigEndian16("flags");
  h.type = r.GetBigEndian16("type");
  h.cookie = r.GetBigEndian64("cookie");
  h.offset = r.GetBigEndian64("offset");
  h.length = r.GetBigEndian32("length");
  TESSERA_RETURN_IF_ERROR(r.Finish("request header"));
  return h;
}

std::string EncodeRequestHeader(const RequestHeader& h) {
  ByteWriter w;
  w.PutBigEndian32(kRequestMagic).PutBigEndian16(h.flags).PutBigEndian16(h.type);
  w.PutBigEndian64(h.cookie).PutBigEndian64(h.offset).PutBigEndian32(h.length);
  return w.TakeString();
}

std::string EncodeSimpleReply(uint32_t error, uint64_t cookie) {
  ByteWriter w;
  w.PutBigEndian32(kSimpleReplyMagic).PutBigEndian32(error).PutBigEndian64(cookie);
  return w.TakeString();
}

std::string EncodeStructuredHeader(uint16_t flags, uint16_t type, uint64_t cookie,
                                   uint32_t length) {
  ByteWriter w;
  w.PutBigEndian32(kStructuredReplyMagic).PutBigEndian16(flags).PutBigEndian16(type);
  w.PutBigEndian64(cookie).PutBigEndian32(length);
  return w.TakeString();
}

std::string EncodeStructuredError(uint64_t cookie, uint32_t error, std::string_view message) {
  if (message.size() > 4096) message = message.substr(0, 4096);
  ByteWriter w;
  w.PutBigEndian32(error).PutBigEndian16(static_cast<uint16_t>(message.size())).PutBytes(message);
  return EncodeStructuredHeader(kReplyFlagDone, kReplyTypeError, cookie,
                                static_cast<uint32_t>(6 + message.size())) +
         w.TakeString();
}

std::string CommandName(uint16_t type) {
  switch (type) {
    case kCmdRead: return "READ";
    case kCmdWrite: return "WRITE";
    case kCmdDisc: return "DISC";
    case kCmdFlush: return "FLUSH";
    case kCmdTrim: return "TRIM";
    case kCmdCache: return "CACHE";
    case kCmdWriteZeroes: return "WRITE_ZEROES";
    case kCmdBlockStatus: return "BLOCK_STATUS";
    default: return "command " + std::to_string(type);
  }
}

std::string OptionName(uint32_t option) {
  switch (option) {
    case kOptExportName: return "NBD_OPT_EXPORT_NAME";
    case kOptAbort: return "NBD_OPT_ABORT";
    case kOptList: return "NBD_OPT_LIST";
    case kOptStartTls: return "NBD_OPT_STARTTLS";
    case kOptInfo: return "NBD_OPT_INFO";
    case kOptGo: return "NBD_OPT_GO";
    case kOptStructuredReply: return "NBD_OPT_STRUCTURED_REPLY";
    default: return "option " + std::to_string(option);
  }
}

}  // namespace tessera::nbd
