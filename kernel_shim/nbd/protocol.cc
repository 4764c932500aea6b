#include "kernel_shim/nbd/protocol.h"

#include <cstdio>

namespace tessera::nbd {

void PutU16(std::string* out, uint16_t v) {
  out->push_back(static_cast<char>(v >> 8));
  out->push_back(static_cast<char>(v));
}
void PutU32(std::string* out, uint32_t v) {
  PutU16(out, static_cast<uint16_t>(v >> 16));
  PutU16(out, static_cast<uint16_t>(v));
}
void PutU64(std::string* out, uint64_t v) {
  PutU32(out, static_cast<uint32_t>(v >> 32));
  PutU32(out, static_cast<uint32_t>(v));
}
uint16_t GetU16(const uint8_t* p) { return static_cast<uint16_t>((p[0] << 8) | p[1]); }
uint32_t GetU32(const uint8_t* p) {
  return (static_cast<uint32_t>(GetU16(p)) << 16) | GetU16(p + 2);
}
uint64_t GetU64(const uint8_t* p) {
  return (static_cast<uint64_t>(GetU32(p)) << 32) | GetU32(p + 4);
}

std::string EncodeGreeting(uint16_t handshake_flags) {
  std::string s;
  PutU64(&s, kNbdMagic);
  PutU64(&s, kIHaveOpt);
  PutU16(&s, handshake_flags);
  return s;
}

std::string EncodeOptionReply(uint32_t option, uint32_t type, std::string_view data) {
  std::string s;
  PutU64(&s, kOptReplyMagic);
  PutU32(&s, option);
  PutU32(&s, type);
  PutU32(&s, static_cast<uint32_t>(data.size()));
  s.append(data);
  return s;
}

std::string EncodeServerReplyData(std::string_view name, std::string_view description) {
  std::string s;
  PutU32(&s, static_cast<uint32_t>(name.size()));
  s.append(name);
  s.append(description);
  return s;
}

std::string EncodeInfoExport(uint64_t size, uint16_t transmission_flags) {
  std::string s;
  PutU16(&s, kInfoExport);
  PutU64(&s, size);
  PutU16(&s, transmission_flags);
  return s;
}

std::string EncodeInfoName(std::string_view name) {
  std::string s;
  PutU16(&s, kInfoName);
  s.append(name);
  return s;
}

std::string EncodeInfoDescription(std::string_view description) {
  std::string s;
  PutU16(&s, kInfoDescription);
  s.append(description);
  return s;
}

std::string EncodeInfoBlockSize(uint32_t minimum, uint32_t preferred, uint32_t maximum) {
  std::string s;
  PutU16(&s, kInfoBlockSize);
  PutU32(&s, minimum);
  PutU32(&s, preferred);
  PutU32(&s, maximum);
  return s;
}

Result<InfoRequest> DecodeInfoRequest(std::string_view payload) {
  const auto* p = reinterpret_cast<const uint8_t*>(payload.data());
  const size_t n = payload.size();
  if (n < 6) return ProtocolError("info request of ", n, " bytes is shorter than 6");
  const uint32_t name_len = GetU32(p);
  if (name_len > n - 6) {
    return ProtocolError("info request names ", name_len, " bytes of export name but carries ",
                         n - 6);
  }
  InfoRequest req;
  req.name.assign(payload.substr(4, name_len));
  const uint16_t count = GetU16(p + 4 + name_len);
  if (static_cast<size_t>(count) * 2 != n - 6 - name_len) {
    return ProtocolError("info request lists ", count, " information types in ",
                         n - 6 - name_len, " bytes");
  }
  for (uint16_t i = 0; i < count; ++i) req.info_types.push_back(GetU16(p + 6 + name_len + 2 * i));
  return req;
}

Result<RequestHeader> DecodeRequestHeader(const uint8_t* b) {
  const uint32_t magic = GetU32(b);
  if (magic != kRequestMagic) {
    return ProtocolError("bad request magic 0x", [magic] {
      char buf[16];
      std::snprintf(buf, sizeof buf, "%08x", magic);
      return std::string(buf);
    }());
  }
  RequestHeader h;
  h.flags = GetU16(b + 4);
  h.type = GetU16(b + 6);
  h.cookie = GetU64(b + 8);
  h.offset = GetU64(b + 16);
  h.length = GetU32(b + 24);
  return h;
}

std::string EncodeRequestHeader(const RequestHeader& h) {
  std::string s;
  PutU32(&s, kRequestMagic);
  PutU16(&s, h.flags);
  PutU16(&s, h.type);
  PutU64(&s, h.cookie);
  PutU64(&s, h.offset);
  PutU32(&s, h.length);
  return s;
}

std::string EncodeSimpleReply(uint32_t error, uint64_t cookie) {
  std::string s;
  PutU32(&s, kSimpleReplyMagic);
  PutU32(&s, error);
  PutU64(&s, cookie);
  return s;
}

std::string EncodeStructuredHeader(uint16_t flags, uint16_t type, uint64_t cookie,
                                   uint32_t length) {
  std::string s;
  PutU32(&s, kStructuredReplyMagic);
  PutU16(&s, flags);
  PutU16(&s, type);
  PutU64(&s, cookie);
  PutU32(&s, length);
  return s;
}

std::string EncodeStructuredError(uint64_t cookie, uint32_t error, std::string_view message) {
  if (message.size() > 4096) message = message.substr(0, 4096);
  std::string s = EncodeStructuredHeader(kReplyFlagDone, kReplyTypeError, cookie,
                                         static_cast<uint32_t>(6 + message.size()));
  PutU32(&s, error);
  PutU16(&s, static_cast<uint16_t>(message.size()));
  s.append(message);
  return s;
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
