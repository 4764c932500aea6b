// Socket helpers (see fabric/socket.h).
#include "fabric/socket.h"

#include "common/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

namespace tessera::fabric {

Result<UniqueFd> ConnectTcp(const Endpoint& ep, Deadline deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port = std::to_string(ep.port);
  int rc = getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) return Unavailable("cannot resolve '", ep.host, "': ", gai_strerror(rc));
  Status last = Unavailable("no address for ", ep.ToString());
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                         ai->ai_protocol));
    if (!fd) {
      last = ErrnoError("socket");
      continue;
    }
    SetNoDelay(fd.get());
    if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last = Unavailable("connect to ", ep.ToString(), ": ", strerror(errno));
        continue;
      }
      Status st = WaitFd(fd.get(), POLLOUT, deadline, "connect");
      if (!st.ok()) {
        freeaddrinfo(res);
        return Timeout("connect to ", ep.ToString(), " timed out");
      }
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        last = Unavailable("connect to ", ep.ToString(), ": ", strerror(err));
        continue;
      }
    }
    freeaddrinfo(res);
    return fd;
  }
  freeaddrinfo(res);
  return last;
}

Result<UniqueFd> BindListener(const std::string& host, uint16_t port, bool reuseport) {
  ListenOptions o;
  o.backlog = 1024;
  o.reuse_port = reuseport;
  return ListenTcp(host, port, o);
}

Result<uint16_t> PickListenPort() {
  int lo = 32768;  // The kernel's default start of the ephemeral range.
  {
    std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
    int first = 0, last = 0;
    if (range >> first >> last && first > 0) lo = first;
  }
  constexpr int kMin = 10000;  // Above the well-known and most registered service ports.
  if (lo - kMin < 1000) {
    return Unavailable("no room for a listening port below the ephemeral range (it starts at ", lo,
                       ")");
  }
  std::random_device seed;
  std::mt19937 rng(seed());
  std::uniform_int_distribution<int> pick(kMin, lo - 1);
  for (int attempt = 0; attempt < 256; ++attempt) {  // Each free with p > 0.99 on a busy host.
    const int port = pick(rng);
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) return ErrnoError("socket");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0) {
      return static_cast<uint16_t>(port);
    }
    if (errno != EADDRINUSE) return ErrnoError("bind 127.0.0.1:", port);
  }
  return Unavailable("no free loopback port in [", kMin, ", ", lo, ") after 256 tries");
}

uint16_t BoundPort(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

std::string FormatAddress(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    return std::string(buf) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
    return "[" + std::string(buf) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return "unknown";
}

std::string PeerAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "unknown";
  return FormatAddress(ss);
}

void SetNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

Status SetBlocking(int fd, bool blocking) {
  int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0) return ErrnoError("fcntl(F_GETFL)");
  int want = blocking ? (fl & ~O_NONBLOCK) : (fl | O_NONBLOCK);
  if (want != fl && ::fcntl(fd, F_SETFL, want) != 0) return ErrnoError("fcntl(F_SETFL)");
  return Status::Ok();
}

Status WaitFd(int fd, short events, Deadline deadline, const char* what) {
  while (true) {
    pollfd p{fd, events, 0};
    int ms = deadline.RemainingMs();
    if (ms == 0) return Timeout(what, ": deadline passed");
    int rc = ::poll(&p, 1, ms);
    if (rc > 0) return Status::Ok();
    if (rc == 0) return Timeout(what, ": deadline passed");
    if (errno != EINTR) return ErrnoError("poll");
  }
}

Status SendAll(int fd, std::span<const uint8_t> data, Deadline deadline) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      TESSERA_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline, "send"));
      continue;
    }
    return Unavailable("send failed: ", n < 0 ? strerror(errno) : "closed");
  }
  return Status::Ok();
}

Status RecvAll(int fd, std::span<uint8_t> out, Deadline deadline) {
  size_t off = 0;
  while (off < out.size()) {
    ssize_t n = ::recv(fd, out.data() + off, out.size() - off, 0);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return Unavailable("the peer closed the connection");
    if (errno == EAGAIN || errno == EINTR) {
      TESSERA_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline, "receive"));
      continue;
    }
    return Unavailable("receive failed: ", strerror(errno));
  }
  return Status::Ok();
}

Result<std::vector<uint8_t>> RecvFrame(int fd, Direction direction, Deadline deadline) {
  std::vector<uint8_t> buf(kHeaderSize);
  TESSERA_RETURN_IF_ERROR(RecvAll(fd, buf, deadline));
  TESSERA_ASSIGN_OR_RETURN(FrameHeader h, DecodeHeader(buf, direction));
  buf.resize(kHeaderSize + h.payload_len);
  TESSERA_RETURN_IF_ERROR(RecvAll(fd, std::span<uint8_t>(buf).subspan(kHeaderSize), deadline));
  return buf;
}

}  // namespace tessera::fabric
