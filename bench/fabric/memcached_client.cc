#include "bench/fabric/memcached_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <cstdio>
#include <cstring>

namespace tessera::bench {
namespace {

constexpr uint8_t kRequestMagic = 0x80;
constexpr uint8_t kResponseMagic = 0x81;
constexpr size_t kHeader = 24;
constexpr size_t kKeyLen = 16;

void PutBe16(uint8_t* p, uint16_t v) {
  p[0] = uint8_t(v >> 8);
  p[1] = uint8_t(v);
}
void PutBe32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (24 - 8 * i));
}
uint16_t GetBe16(const uint8_t* p) { return uint16_t((p[0] << 8) | p[1]); }
uint32_t GetBe32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
}

}  // namespace

namespace {
// Writes the 16-byte key of (size, index) to out (no allocation).
void FormatKey(uint32_t size, uint32_t index, uint8_t* out) {
  char buf[kKeyLen + 1];
  std::snprintf(buf, sizeof(buf), "s%05uk%09u", size % 100000, index % 1000000000);
  std::memcpy(out, buf, kKeyLen);
}
}  // namespace

std::string MemcachedKey(uint32_t size, uint32_t index) {
  uint8_t buf[kKeyLen];
  FormatKey(size, index, buf);
  return std::string(reinterpret_cast<char*>(buf), kKeyLen);
}

Status MemcachedClient::Connect(const std::vector<std::pair<std::string, uint16_t>>& endpoints,
                                Deadline deadline) {
  epoll_.Reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_) return ErrnoError("epoll_create1");
  for (const auto& [host, port] : endpoints) {
    in_addr addr{};
    if (::inet_pton(AF_INET, host.c_str(), &addr) != 1) {
      return InvalidArgument("memcached address '", host, "' is not an IPv4 address");
    }
    Conn c;
    while (true) {
      c.fd.Reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      if (!c.fd) return ErrnoError("socket");
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(port);
      a.sin_addr = addr;
      if (::connect(c.fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) break;
      if (deadline.Expired()) {
        return Unavailable("memcached on ", host, ":", port, " does not accept connections: ",
                           std::strerror(errno));
      }
      // memcached is still starting: wait a little for it (bounded by the deadline).
      ::poll(nullptr, 0, 5);
    }
    int one = 1;
    ::setsockopt(c.fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c.in.resize(1 << 20);
    c.out.reserve(1 << 20);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = static_cast<uint32_t>(conns_.size());
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, c.fd.get(), &ev) != 0) return ErrnoError("epoll_ctl");
    conns_.push_back(std::move(c));
  }
  return Status::Ok();
}

void MemcachedClient::Queue(int conn, Op op, uint32_t size, uint32_t key_index,
                            const uint8_t* value, uint32_t opaque) {
  Conn& c = conns_[conn];
  size_t extras = op == Op::kSet ? 8 : 0;
  size_t body = extras + kKeyLen + (op == Op::kSet ? size : 0);
  size_t at = c.out.size();
  c.out.resize(at + kHeader + body);
  uint8_t* p = c.out.data() + at;
  std::memset(p, 0, kHeader);
  p[0] = kRequestMagic;
  p[1] = static_cast<uint8_t>(op);
  PutBe16(p + 2, kKeyLen);
  p[4] = static_cast<uint8_t>(extras);
  PutBe32(p + 8, static_cast<uint32_t>(body));
  PutBe32(p + 12, opaque);
  uint8_t* q = p + kHeader;
  if (op == Op::kSet) {
    std::memset(q, 0, 8);  // flags, expiration
    q += 8;
  }
  FormatKey(size, key_index, q);
  q += kKeyLen;
  if (op == Op::kSet) std::memcpy(q, value, size);
  c.outstanding++;
}

Status MemcachedClient::Flush() {
  for (Conn& c : conns_) {
    while (c.out_off < c.out.size()) {
      ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_off, c.out.size() - c.out_off,
                         MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoError("send to memcached");
      }
      c.out_off += static_cast<size_t>(n);
    }
    c.out.clear();
    c.out_off = 0;
  }
  return Status::Ok();
}

Status MemcachedClient::Poll(std::vector<Reply>* out) {
  auto drain = [&](Conn& c) -> Status {
    while (true) {
      if (c.in_end == c.in.size()) {
        if (c.in_start == 0) c.in.resize(c.in.size() * 2);
        std::memmove(c.in.data(), c.in.data() + c.in_start, c.in_end - c.in_start);
        c.in_end -= c.in_start;
        c.in_start = 0;
      }
      ssize_t n = ::recv(c.fd.get(), c.in.data() + c.in_end, c.in.size() - c.in_end, MSG_DONTWAIT);
      if (n > 0) {
        c.in_end += static_cast<size_t>(n);
        TESSERA_RETURN_IF_ERROR(ParseReplies(c, out));
        if (static_cast<size_t>(n) < 65536) return Status::Ok();
        continue;
      }
      if (n == 0) return Unavailable("memcached closed the connection");
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::Ok();
      if (errno != EINTR) return ErrnoError("recv from memcached");
    }
  };
  if (conns_.size() == 1) {
    if (conns_[0].outstanding > 0) return drain(conns_[0]);
    return Status::Ok();
  }
  epoll_event evs[64];
  int n = ::epoll_wait(epoll_.get(), evs, 64, 0);
  if (n < 0 && errno != EINTR) return ErrnoError("epoll_wait");
  for (int i = 0; i < n; ++i) TESSERA_RETURN_IF_ERROR(drain(conns_[evs[i].data.u32]));
  return Status::Ok();
}

Status MemcachedClient::ParseReplies(Conn& c, std::vector<Reply>* out) {
  while (c.in_end - c.in_start >= kHeader) {
    const uint8_t* p = c.in.data() + c.in_start;
    if (p[0] != kResponseMagic) return Internal("memcached reply with bad magic ", int(p[0]));
    uint32_t body = GetBe32(p + 8);
    if (c.in_end - c.in_start < kHeader + body) break;
    uint16_t status = GetBe16(p + 6);
    uint8_t extras = p[4];
    uint16_t key_len = GetBe16(p + 2);
    Reply r{GetBe32(p + 12), status == 0};
    if (p[1] == static_cast<uint8_t>(Op::kGet) && status == 0) {
      uint32_t value_len = body - extras - key_len;
      const uint8_t* value = p + kHeader + extras + key_len;
      if (sink_ != nullptr && value_len == sink_size_) {
        std::memcpy(sink_, value, value_len);
      } else {
        r.ok = false;
      }
    }
    out->push_back(r);
    c.outstanding--;
    c.in_start += kHeader + body;
  }
  if (c.in_start == c.in_end) c.in_start = c.in_end = 0;
  return Status::Ok();
}

}  // namespace tessera::bench
