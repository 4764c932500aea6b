// Internal to fabric/: the socket helpers of the server engine, the TCP transport and the
// control client (resolve + connect with a deadline, listen, addresses, blocking-with-deadline
// send/receive of whole frames for the handshake and the control path).
//
// Thread safety: every function is reentrant; the fds passed in belong to the caller.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/fd.h"
#include "common/status.h"
#include "fabric/connect.h"
#include "fabric/transport.h"
#include "fabric/wire.h"

namespace tessera::fabric {

// ConnectTcp, PickListenPort, SetNoDelay and SetBlocking are public: fabric/connect.h.

// A listening TCP socket bound to host:port (SO_REUSEADDR; SO_REUSEPORT when `reuseport`),
// blocking, close-on-exec.
Result<UniqueFd> BindListener(const std::string& host, uint16_t port, bool reuseport);
// The local port of a bound socket (0 if unknown).
uint16_t BoundPort(int fd);
// "1.2.3.4:5" / "[::1]:5" for an AF_INET/AF_INET6 address, "unknown" otherwise.
std::string FormatAddress(const sockaddr_storage& address);
// FormatAddress(getpeername(fd)).
std::string PeerAddress(int fd);

// Waits until `fd` has one of `events` (POLLIN/POLLOUT) or the deadline (Timeout naming `what`).
Status WaitFd(int fd, short events, Deadline deadline, const char* what);
// Sends all of `data` on a non-blocking socket within the deadline; Unavailable when the peer
// is gone.
Status SendAll(int fd, std::span<const uint8_t> data, Deadline deadline);
// Receives exactly `out.size()` bytes on a non-blocking socket within the deadline;
// Unavailable when the peer closed first.
Status RecvAll(int fd, std::span<uint8_t> out, Deadline deadline);
// Receives one whole frame in `direction` (header validated first, so a hostile length is
// refused before any allocation); returns its bytes, header included.
Result<std::vector<uint8_t>> RecvFrame(int fd, Direction direction, Deadline deadline);

}  // namespace tessera::fabric
