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
#include "fabric/transport.h"
#include "fabric/wire.h"

namespace tessera::fabric {

// A non-blocking TCP socket connected to `endpoint` (TCP_NODELAY set) within `deadline`.
// Unavailable when refused or unresolvable, Timeout at the deadline.
Result<UniqueFd> ConnectTcp(const Endpoint& endpoint, Deadline deadline);

// A listening TCP socket bound to host:port (SO_REUSEADDR; SO_REUSEPORT when `reuseport`),
// blocking, close-on-exec.
Result<UniqueFd> BindListener(const std::string& host, uint16_t port, bool reuseport);
// A loopback port for another process (etcd, redis, a restarted server) to listen on: free now,
// and below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range), so that no
// outgoing connection on the host is given it before that process binds it. A port taken by
// bind(port 0) and closed again is in that range and can be taken in between.
Result<uint16_t> PickListenPort();
// The local port of a bound socket (0 if unknown).
uint16_t BoundPort(int fd);
// "1.2.3.4:5" / "[::1]:5" for an AF_INET/AF_INET6 address, "unknown" otherwise.
std::string FormatAddress(const sockaddr_storage& address);
// FormatAddress(getpeername(fd)).
std::string PeerAddress(int fd);

void SetNoDelay(int fd);
Status SetBlocking(int fd, bool blocking);

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
