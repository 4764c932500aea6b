// Blocking socket I/O for the Parameter Service protocol (wire.h): whole frames in and out.
// Thread safety: functions over one fd; callers serialise writers of one fd themselves.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "apps/paramsvc/wire/wire.h"
#include "common/fd.h"
#include "common/status.h"

namespace tessera::paramsvc {

// Reads one frame: the header is validated (DecodeHeader) before the payload is read.
// Unavailable on EOF/reset, ProtocolError for a bad header, Timeout when SO_RCVTIMEO expires.
Status ReadFrame(int fd, Header* h, std::vector<uint8_t>* payload);
// Writes header + up to three payload pieces (payload_len is set from them).
Status WriteFrame(int fd, Header h, std::span<const uint8_t> a = {},
                  std::span<const uint8_t> b = {}, std::span<const uint8_t> c = {});
// TCP connect with a bound on the wait; TCP_NODELAY set.
Result<UniqueFd> ConnectTcp(const std::string& host, uint16_t port, int timeout_ms);
// Sets SO_RCVTIMEO / SO_SNDTIMEO (0: none).
void SetSocketTimeouts(int fd, int recv_ms, int send_ms);

}  // namespace tessera::paramsvc
