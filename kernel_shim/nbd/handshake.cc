// The NBD handshake (see kernel_shim/nbd/handshake.h).
#include "kernel_shim/nbd/handshake.h"

#include <string_view>

#include "common/coding.h"
#include "common/logging.h"
#include "kernel_shim/nbd/protocol.h"
#include "kernel_shim/nbd/socket_io.h"

namespace tessera::nbd {

using client::kPageSize;

const ExportSpec* FindExport(const NbdServerOptions& options, const std::string& name) {
  for (const ExportSpec& e : options.exports) {
    if (e.name == name) return &e;
  }
  if (name.empty()) return &options.exports.front();  // The default export.
  return nullptr;
}

std::optional<Negotiated> NegotiateHandshake(int f, const NbdServerOptions& options,
                                             const std::string& peer) {
  SetRecvTimeoutMs(f, options.handshake_timeout_ms);
  auto SendOptionReply = [f](uint32_t option, uint32_t type, std::string_view data) {
    return WriteString(f, EncodeOptionReply(option, type, data));
  };
  Negotiated n;
  bool& structured = n.structured;
  uint16_t& trans_flags = n.trans_flags;
  const ExportSpec*& exp = n.exp;

  if (!WriteString(f, EncodeGreeting(kFlagFixedNewstyle | kFlagNoZeroes))) return std::nullopt;
  uint8_t b[16];
  if (!ReadFull(f, b, 4)) return std::nullopt;
  const uint32_t client_flags = DecodeBigEndian32(b);
  if ((client_flags & ~(kClientFlagFixedNewstyle | kClientFlagNoZeroes)) != 0) {
    TLOG(WARNING) << "nbd " << peer << ": unknown client flags " << client_flags << "; closing";
    return std::nullopt;
  }
  const bool no_zeroes = (client_flags & kClientFlagNoZeroes) != 0;

  for (;;) {
    if (!ReadFull(f, b, 16)) return std::nullopt;
    SpanReader r(std::span<const uint8_t>(b, 16));
    if (r.GetBigEndian64("option magic") != kIHaveOpt) {
      TLOG(WARNING) << "nbd " << peer << ": bad option magic; closing";
      return std::nullopt;
    }
    const uint32_t option = r.GetBigEndian32("option");
    const uint32_t len = r.GetBigEndian32("option length");
    if (len > 65536) {
      TLOG(WARNING) << "nbd " << peer << ": " << OptionName(option) << " with " << len
                    << " bytes of data is too long; closing";
      return std::nullopt;
    }
    std::string data(len, '\0');
    if (len > 0 && !ReadFull(f, data.data(), len)) return std::nullopt;

    trans_flags = kTransHasFlags | kTransSendFlush | kTransSendFua | kTransSendTrim |
                  kTransSendWriteZeroes | kTransCanMultiConn | (structured ? kTransSendDf : 0);
    switch (option) {
      case kOptExportName: {
        exp = FindExport(options, data);
        if (exp == nullptr) {
          TLOG(WARNING) << "nbd " << peer << ": NBD_OPT_EXPORT_NAME of unknown export \""
                        << data << "\"; closing";
          return std::nullopt;
        }
        ByteWriter w;
        w.PutBigEndian64(exp->size_bytes).PutBigEndian16(trans_flags);
        std::string reply = w.TakeString();
        if (!no_zeroes) reply.append(124, '\0');
        if (!WriteString(f, reply)) return std::nullopt;
        break;
      }
      case kOptAbort:
        SendOptionReply(option, kRepAck, "");
        return std::nullopt;
      case kOptList: {
        if (len != 0) {
          if (!SendOptionReply(option, kRepErrInvalid, "NBD_OPT_LIST takes no data")) return std::nullopt;
          continue;
        }
        for (const ExportSpec& e : options.exports) {
          if (!SendOptionReply(option, kRepServer, EncodeServerReplyData(e.name, e.description))) {
            return std::nullopt;
          }
        }
        if (!SendOptionReply(option, kRepAck, "")) return std::nullopt;
        continue;
      }
      case kOptStructuredReply:
        if (len != 0) {
          if (!SendOptionReply(option, kRepErrInvalid, "NBD_OPT_STRUCTURED_REPLY takes no data")) {
            return std::nullopt;
          }
          continue;
        }
        structured = true;
        if (!SendOptionReply(option, kRepAck, "")) return std::nullopt;
        continue;
      case kOptInfo:
      case kOptGo: {
        auto req = DecodeInfoRequest(data);
        if (!req.ok()) {
          if (!SendOptionReply(option, kRepErrInvalid, req.status().message())) return std::nullopt;
          continue;
        }
        const ExportSpec* e = FindExport(options, req->name);
        if (e == nullptr) {
          if (!SendOptionReply(option, kRepErrUnknown, "no export named \"" + req->name + "\"")) {
            return std::nullopt;
          }
          continue;
        }
        bool ok = SendOptionReply(option, kRepInfo, EncodeInfoExport(e->size_bytes, trans_flags)) &&
                  SendOptionReply(option, kRepInfo, EncodeInfoName(e->name)) &&
                  (e->description.empty() ||
                   SendOptionReply(option, kRepInfo, EncodeInfoDescription(e->description))) &&
                  SendOptionReply(option, kRepInfo,
                                  EncodeInfoBlockSize(1, kPageSize, options.max_payload)) &&
                  SendOptionReply(option, kRepAck, "");
        if (!ok) return std::nullopt;
        if (option == kOptInfo) continue;
        exp = e;
        break;
      }
      default:
        if (!SendOptionReply(option, kRepErrUnsup, OptionName(option) + " is not supported")) {
          return std::nullopt;
        }
        continue;
    }
    break;  // Transmission phase.
  }
  SetRecvTimeoutMs(f, 0);
  return n;
}

}  // namespace tessera::nbd
