// Listening sockets, one way for every server of Tessera (the memory server's engine, the
// metrics endpoints, the NBD export, the Parameter Service): an IPv4 or IPv6 address or host
// name ("127.0.0.1", "::1", "[::1]", "localhost"; empty: every address), SO_REUSEADDR, and
// the port the kernel picked when asked for port 0.
#pragma once

#include <cstdint>
#include <string>

#include "common/fd.h"
#include "common/status.h"

namespace tessera {

struct ListenOptions {
  int backlog = 512;
  bool reuse_port = false;  // SO_REUSEPORT (a listener that joins another's group).
  bool nonblocking = false;
  const char* what = "";  // Named in errors ("metrics endpoint": "bind metrics endpoint h:p").
};

// A TCP socket bound to host:port and listening. Every address the host resolves to is tried
// in turn. InvalidArgument when the host does not resolve; the errno of the last failure
// otherwise (EADDRINUSE: "bind HOST:PORT: Address already in use").
Result<UniqueFd> ListenTcp(const std::string& host, uint16_t port,
                           const ListenOptions& options = {});

// The local port of a bound socket (IPv4 or IPv6); 0 on error.
uint16_t BoundPort(int fd);

}  // namespace tessera
