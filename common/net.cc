#include "common/net.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <memory>

namespace tessera {

Result<UniqueFd> ListenTcp(const std::string& host, uint16_t port, const ListenOptions& options) {
  std::string h = host;
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port_text = std::to_string(port);
  const std::string what = options.what[0] ? std::string(options.what) + " " : std::string();
  if (int rc = ::getaddrinfo(h.empty() ? nullptr : h.c_str(), port_text.c_str(), &hints, &res);
      rc != 0) {
    return InvalidArgument("cannot resolve the ", what.empty() ? "listen " : what, "address '",
                           host, "': ", gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(res, &freeaddrinfo);
  Status last = Unavailable("no address for '", host, "'");
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    const int type = ai->ai_socktype | SOCK_CLOEXEC | (options.nonblocking ? SOCK_NONBLOCK : 0);
    UniqueFd fd(::socket(ai->ai_family, type, ai->ai_protocol));
    if (!fd) {
      last = ErrnoError("socket");
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (options.reuse_port &&
        ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0) {
      last = ErrnoError("setsockopt(SO_REUSEPORT)");
      continue;
    }
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last = ErrnoError("bind ", what, host, ":", port);
      continue;
    }
    if (::listen(fd.get(), options.backlog) != 0) {
      last = ErrnoError("listen");
      continue;
    }
    return fd;
  }
  return last;
}

uint16_t BoundPort(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  return ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                  : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

}  // namespace tessera
