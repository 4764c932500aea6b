#include "apps/paramsvc/io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tessera::paramsvc {
namespace {

Status ReadExact(int fd, uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return Unavailable("connection closed by peer");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Timeout("receive timed out");
    return Unavailable("recv: ", std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace

Status ReadFrame(int fd, Header* h, std::vector<uint8_t>* payload) {
  uint8_t hb[kHeaderSize];
  Status s = ReadExact(fd, hb, kHeaderSize);
  if (!s.ok()) return s;
  auto hdr = DecodeHeader(hb);
  if (!hdr.ok()) return hdr.status();
  *h = *hdr;
  payload->resize(h->payload_len);
  if (h->payload_len > 0) return ReadExact(fd, payload->data(), h->payload_len);
  return Status::Ok();
}

Status WriteFrame(int fd, Header h, std::span<const uint8_t> a, std::span<const uint8_t> b,
                  std::span<const uint8_t> c) {
  h.payload_len = static_cast<uint32_t>(a.size() + b.size() + c.size());
  uint8_t hb[kHeaderSize];
  EncodeHeader(h, hb);
  iovec iov[4];
  int n = 0;
  iov[n++] = {hb, kHeaderSize};
  for (auto sp : {a, b, c}) {
    if (!sp.empty()) iov[n++] = {const_cast<uint8_t*>(sp.data()), sp.size()};
  }
  int first = 0;
  while (first < n) {
    msghdr msg{};
    msg.msg_iov = iov + first;
    msg.msg_iovlen = n - first;
    ssize_t w = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Timeout("send timed out");
      return Unavailable("send: ", std::strerror(errno));
    }
    size_t left = static_cast<size_t>(w);
    while (first < n && left >= iov[first].iov_len) {
      left -= iov[first].iov_len;
      ++first;
    }
    if (first < n) {
      iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  return Status::Ok();
}

Result<UniqueFd> ConnectTcp(const std::string& host, uint16_t port, int timeout_ms) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string ps = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), ps.c_str(), &hints, &res);
  if (rc != 0) return Unavailable("resolve ", host, ": ", gai_strerror(rc));
  Status last = Unavailable("no address for ", host);
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) {
      last = ErrnoError("socket");
      continue;
    }
    if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last = Unavailable("connect ", host, ":", port, ": ", std::strerror(errno));
        continue;
      }
      pollfd pfd{fd.get(), POLLOUT, 0};
      int pr = ::poll(&pfd, 1, timeout_ms);
      int err = 0;
      socklen_t len = sizeof(err);
      if (pr <= 0) {
        last = Timeout("connect ", host, ":", port, ": no answer within ", timeout_ms, " ms");
        continue;
      }
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        last = Unavailable("connect ", host, ":", port, ": ", std::strerror(err));
        continue;
      }
    }
    int fl = ::fcntl(fd.get(), F_GETFL);
    ::fcntl(fd.get(), F_SETFL, fl & ~O_NONBLOCK);
    int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::freeaddrinfo(res);
    return fd;
  }
  ::freeaddrinfo(res);
  return last;
}

void SetSocketTimeouts(int fd, int recv_ms, int send_ms) {
  timeval rt{recv_ms / 1000, (recv_ms % 1000) * 1000};
  timeval st{send_ms / 1000, (send_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &rt, sizeof(rt));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &st, sizeof(st));
}

}  // namespace tessera::paramsvc
