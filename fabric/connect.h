// Connecting to a memory server from outside fabric/'s transports: a TCP socket with a
// deadline, an authenticated socket (the HELLO/CHALLENGE/AUTH handshake of fabric/auth.h run
// over it), the socket options a framed stream wants, and a free loopback port for another
// process to listen on. Services' clients (on connections of their own), the tests and the
// benches use these; the transports and the control client use them too (fabric/socket.h,
// fabric/handshake.h).
//
// Ownership: the fds returned belong to the caller; the fds passed in stay the caller's.
// Threads: every function is reentrant.
#pragma once

#include <cstdint>

#include "common/clock.h"
#include "common/fd.h"
#include "common/status.h"
#include "fabric/transport.h"
#include "fabric/wire.h"

namespace tessera::fabric {

// A non-blocking TCP socket connected to `endpoint` (TCP_NODELAY set) within `deadline`.
// Unavailable when refused or unresolvable, Timeout at the deadline.
Result<UniqueFd> ConnectTcp(const Endpoint& endpoint, Deadline deadline);

// A loopback port for another process (etcd, redis, a restarted server) to listen on: free now,
// and below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range), so that no
// outgoing connection on the host is given it before that process binds it. A port taken by
// bind(port 0) and closed again is in that range and can be taken in between.
Result<uint16_t> PickListenPort();

void SetNoDelay(int fd);
Status SetBlocking(int fd, bool blocking);

// What an authenticated client connection learnt from the server.
struct ClientLogin {
  uint64_t server_id = 0;
  AuthOkResponse auth_ok;
};

// A connected, authenticated socket to a server: ConnectTcp + the client half of the handshake
// within options.deadline. The socket stays non-blocking.
struct ClientSocket {
  UniqueFd fd;
  ClientLogin login;
};
Result<ClientSocket> ConnectAndAuthenticate(const Endpoint& endpoint,
                                            const ConnectOptions& options);

}  // namespace tessera::fabric
