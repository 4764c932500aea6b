// Socket I/O of the NBD export (see kernel_shim/nbd/socket_io.h).
#include "kernel_shim/nbd/socket_io.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>

#include "common/net.h"

namespace tessera::nbd {

bool ReadFull(int fd, void* buf, size_t n) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    ssize_t got = ::recv(fd, p, n, 0);
    if (got > 0) {
      p += got;
      n -= static_cast<size_t>(got);
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    return false;
  }
  return true;
}

bool BufferedReader::ReadFull(void* out, size_t n) {
  auto* p = static_cast<uint8_t*>(out);
  const size_t have = std::min(n, buffered());
  std::memcpy(p, buf_.get() + pos_, have);
  pos_ += have;
  p += have;
  n -= have;
  if (n == 0) return true;
  pos_ = len_ = 0;  // Empty now.
  if (n >= cap_ / 2) return nbd::ReadFull(fd_, p, n);  // A payload: no copy through the buffer.
  while (len_ < n) {
    ssize_t got = ::recv(fd_, buf_.get() + len_, cap_ - len_, 0);
    if (got > 0) {
      len_ += static_cast<size_t>(got);
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    return false;
  }
  std::memcpy(p, buf_.get(), n);
  pos_ = n;
  return true;
}

bool BufferedReader::Readable() const {
  if (buffered() > 0) return true;
  pollfd pfd{fd_, POLLIN, 0};
  return ::poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
}

bool WriteIov(int fd, struct iovec* iov, size_t count) {
  while (count > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = std::min<size_t>(count, IOV_MAX);
    ssize_t sent = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    size_t left = static_cast<size_t>(sent);
    while (count > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0 && left > 0) {
      iov->iov_base = static_cast<uint8_t*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return true;
}

bool WriteString(int fd, const std::string& s) {
  struct iovec iov = {const_cast<char*>(s.data()), s.size()};
  return WriteIov(fd, &iov, 1);
}

namespace {
void SetTimeout(int fd, int option, uint32_t ms) {
  struct timeval tv = {static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
  ::setsockopt(fd, SOL_SOCKET, option, &tv, sizeof tv);
}
}  // namespace

void SetRecvTimeoutMs(int fd, uint32_t ms) { SetTimeout(fd, SO_RCVTIMEO, ms); }
void SetSendTimeoutMs(int fd, uint32_t ms) { SetTimeout(fd, SO_SNDTIMEO, ms); }

void SetNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string PeerName(int fd) {
  sockaddr_storage ss{};
  socklen_t sl = sizeof ss;
  char host[NI_MAXHOST] = "", serv[NI_MAXSERV] = "";
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &sl) == 0 && ss.ss_family != AF_UNIX &&
      ::getnameinfo(reinterpret_cast<sockaddr*>(&ss), sl, host, sizeof host, serv, sizeof serv,
                    NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    return std::string(host) + ":" + serv;
  }
  return "unix";
}

Result<UniqueFd> ListenTcpSocket(const std::string& host, uint16_t port, uint16_t* bound) {
  ListenOptions o;
  o.backlog = 64;
  TESSERA_ASSIGN_OR_RETURN(UniqueFd fd, ListenTcp(host, port, o));
  *bound = BoundPort(fd.get());
  if (*bound == 0) return ErrnoError("getsockname");
  return fd;
}

Result<UniqueFd> ListenUnixSocket(const std::string& path) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof addr.sun_path) {
    return InvalidArgument("unix socket path must be 1..", sizeof addr.sun_path - 1, " bytes");
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoError("socket");
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return ErrnoError("bind ", path);
  }
  if (::listen(fd.get(), 64) != 0) return ErrnoError("listen");
  return fd;
}

}  // namespace tessera::nbd
