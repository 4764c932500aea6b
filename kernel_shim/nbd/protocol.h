// The Network Block Device wire protocol (fixed newstyle handshake, simple and structured
// replies), as specified by github.com/NetworkBlockDevice/nbd doc/proto.md: constants, the
// big-endian encoding of every message the server reads or writes, and the pure decoding of
// request headers and option payloads. No I/O here: nbd_server.cc moves the bytes; this file
// makes them, so it can be unit-tested byte for byte. Every function is pure and thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tessera::nbd {

// --- Handshake ---
inline constexpr uint64_t kNbdMagic = 0x4e42444d41474943ull;     // "NBDMAGIC"
inline constexpr uint64_t kIHaveOpt = 0x49484156454F5054ull;     // "IHAVEOPT"
inline constexpr uint64_t kOptReplyMagic = 0x0003e889045565a9ull;

// Handshake flags (server) and client flags.
inline constexpr uint16_t kFlagFixedNewstyle = 1 << 0;
inline constexpr uint16_t kFlagNoZeroes = 1 << 1;
inline constexpr uint32_t kClientFlagFixedNewstyle = 1 << 0;
inline constexpr uint32_t kClientFlagNoZeroes = 1 << 1;

// Options.
inline constexpr uint32_t kOptExportName = 1;
inline constexpr uint32_t kOptAbort = 2;
inline constexpr uint32_t kOptList = 3;
inline constexpr uint32_t kOptStartTls = 5;
inline constexpr uint32_t kOptInfo = 6;
inline constexpr uint32_t kOptGo = 7;
inline constexpr uint32_t kOptStructuredReply = 8;

// Option reply types.
inline constexpr uint32_t kRepAck = 1;
inline constexpr uint32_t kRepServer = 2;
inline constexpr uint32_t kRepInfo = 3;
inline constexpr uint32_t kRepFlagError = 1u << 31;
inline constexpr uint32_t kRepErrUnsup = kRepFlagError | 1;
inline constexpr uint32_t kRepErrPolicy = kRepFlagError | 2;
inline constexpr uint32_t kRepErrInvalid = kRepFlagError | 3;
inline constexpr uint32_t kRepErrPlatform = kRepFlagError | 4;
inline constexpr uint32_t kRepErrTlsReqd = kRepFlagError | 5;
inline constexpr uint32_t kRepErrUnknown = kRepFlagError | 6;
inline constexpr uint32_t kRepErrShutdown = kRepFlagError | 7;
inline constexpr uint32_t kRepErrBlockSizeReqd = kRepFlagError | 8;
inline constexpr uint32_t kRepErrTooBig = kRepFlagError | 9;

// Information types of NBD_OPT_INFO / NBD_OPT_GO.
inline constexpr uint16_t kInfoExport = 0;
inline constexpr uint16_t kInfoName = 1;
inline constexpr uint16_t kInfoDescription = 2;
inline constexpr uint16_t kInfoBlockSize = 3;

// Transmission flags.
inline constexpr uint16_t kTransHasFlags = 1 << 0;
inline constexpr uint16_t kTransReadOnly = 1 << 1;
inline constexpr uint16_t kTransSendFlush = 1 << 2;
inline constexpr uint16_t kTransSendFua = 1 << 3;
inline constexpr uint16_t kTransRotational = 1 << 4;
inline constexpr uint16_t kTransSendTrim = 1 << 5;
inline constexpr uint16_t kTransSendWriteZeroes = 1 << 6;
inline constexpr uint16_t kTransSendDf = 1 << 7;
inline constexpr uint16_t kTransCanMultiConn = 1 << 8;

// --- Transmission ---
inline constexpr uint32_t kRequestMagic = 0x25609513;
inline constexpr uint32_t kSimpleReplyMagic = 0x67446698;
inline constexpr uint32_t kStructuredReplyMagic = 0x668e33ef;
inline constexpr size_t kRequestHeaderSize = 28;
inline constexpr size_t kSimpleReplySize = 16;
inline constexpr size_t kStructuredHeaderSize = 20;

// Commands.
inline constexpr uint16_t kCmdRead = 0;
inline constexpr uint16_t kCmdWrite = 1;
inline constexpr uint16_t kCmdDisc = 2;
inline constexpr uint16_t kCmdFlush = 3;
inline constexpr uint16_t kCmdTrim = 4;
inline constexpr uint16_t kCmdCache = 5;
inline constexpr uint16_t kCmdWriteZeroes = 6;
inline constexpr uint16_t kCmdBlockStatus = 7;

// Command flags.
inline constexpr uint16_t kCmdFlagFua = 1 << 0;
inline constexpr uint16_t kCmdFlagNoHole = 1 << 1;
inline constexpr uint16_t kCmdFlagDf = 1 << 2;
inline constexpr uint16_t kCmdFlagReqOne = 1 << 3;
inline constexpr uint16_t kCmdFlagFastZero = 1 << 4;

// Structured reply flags and chunk types.
inline constexpr uint16_t kReplyFlagDone = 1 << 0;
inline constexpr uint16_t kReplyTypeNone = 0;
inline constexpr uint16_t kReplyTypeOffsetData = 1;
inline constexpr uint16_t kReplyTypeOffsetHole = 2;
inline constexpr uint16_t kReplyTypeError = (1 << 15) | 1;

// Error values (the protocol's, which match Linux errno).
inline constexpr uint32_t kEPerm = 1;
inline constexpr uint32_t kEIo = 5;
inline constexpr uint32_t kENoMem = 12;
inline constexpr uint32_t kEInval = 22;
inline constexpr uint32_t kENoSpc = 28;
inline constexpr uint32_t kEOverflow = 75;
inline constexpr uint32_t kENotSup = 95;
inline constexpr uint32_t kEShutdown = 108;

// --- Byte helpers (big-endian, network order) for the tests' raw client. The server encodes
// and decodes with the common codec (common/coding.h, its BigEndian variants). ---
void PutU16(std::string* out, uint16_t v);
void PutU32(std::string* out, uint32_t v);
void PutU64(std::string* out, uint64_t v);
uint16_t GetU16(const uint8_t* p);
uint32_t GetU32(const uint8_t* p);
uint64_t GetU64(const uint8_t* p);

// The server's first 18 bytes: NBDMAGIC, IHAVEOPT, handshake flags.
std::string EncodeGreeting(uint16_t handshake_flags);

// One option reply: magic, option, type, length, data.
std::string EncodeOptionReply(uint32_t option, uint32_t type, std::string_view data);

// NBD_REP_SERVER payload for NBD_OPT_LIST: name length, name, then the description.
std::string EncodeServerReplyData(std::string_view name, std::string_view description);
// NBD_REP_INFO payloads.
std::string EncodeInfoExport(uint64_t size, uint16_t transmission_flags);
std::string EncodeInfoName(std::string_view name);
std::string EncodeInfoDescription(std::string_view description);
std::string EncodeInfoBlockSize(uint32_t minimum, uint32_t preferred, uint32_t maximum);

// The payload of NBD_OPT_INFO / NBD_OPT_GO: export name and the information types asked.
struct InfoRequest {
  std::string name;
  std::vector<uint16_t> info_types;
};
// ProtocolError when the lengths inside do not add up to the payload length (the caller then
// answers NBD_REP_ERR_INVALID).
Result<InfoRequest> DecodeInfoRequest(std::string_view payload);

struct RequestHeader {
  uint16_t flags = 0;
  uint16_t type = 0;
  uint64_t cookie = 0;
  uint64_t offset = 0;
  uint32_t length = 0;
};
// Decodes 28 bytes; ProtocolError for a bad magic (the connection must then be closed).
Result<RequestHeader> DecodeRequestHeader(const uint8_t* bytes);
std::string EncodeRequestHeader(const RequestHeader& h);  // For clients and tests.

// Simple reply header (16 bytes); a successful read's data follows it.
std::string EncodeSimpleReply(uint32_t error, uint64_t cookie);
// Structured reply chunk header (20 bytes); `length` bytes of chunk payload follow.
std::string EncodeStructuredHeader(uint16_t flags, uint16_t type, uint64_t cookie,
                                   uint32_t length);
// A complete NBD_REPLY_TYPE_ERROR chunk (header + error + message), with the DONE flag.
std::string EncodeStructuredError(uint64_t cookie, uint32_t error, std::string_view message);

// Names for logs: "READ", "NBD_OPT_GO", ...
std::string CommandName(uint16_t type);
std::string OptionName(uint32_t option);

}  // namespace tessera::nbd
