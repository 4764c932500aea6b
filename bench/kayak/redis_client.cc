#include "bench/kayak/redis_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <future>

namespace kayak::bench {

using tessera::Result;
using tessera::Status;

Result<std::unique_ptr<RedisClient>> RedisClient::Connect(const std::string& host, int port) {
  std::unique_ptr<RedisClient> c(new RedisClient());
  c->fd_.Reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!c->fd_) return tessera::ErrnoError("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    return tessera::InvalidArgument("bad redis host ", host);
  }
  if (::connect(c->fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    return tessera::ErrnoError("connect to redis ", host, ":", port);
  }
  int one = 1;
  setsockopt(c->fd_.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  c->reader_ = std::thread([p = c.get()] { p->ReaderMain(); });
  return c;
}

RedisClient::~RedisClient() {
  if (fd_) ::shutdown(fd_.get(), SHUT_RDWR);
  if (reader_.joinable()) reader_.join();
}

void RedisClient::Send(const std::vector<std::string>& args, Callback cb) {
  std::string out = "*" + std::to_string(args.size()) + "\r\n";
  for (const auto& a : args) {
    out += "$" + std::to_string(a.size()) + "\r\n";
    out += a;
    out += "\r\n";
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (down_) {
    cb(tessera::Unavailable("redis connection lost"));
    return;
  }
  pending_.push_back(std::move(cb));
  out_ += out;
  // From a reply callback: written with the others when the reader is done with this recv().
  if (batching_ && std::this_thread::get_id() == reader_id_) return;
  FlushLocked();
}

void RedisClient::FlushLocked() {
  size_t off = 0;
  while (off < out_.size()) {
    ssize_t n = ::send(fd_.get(), out_.data() + off, out_.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::shutdown(fd_.get(), SHUT_RDWR);
      break;
    }
    off += static_cast<size_t>(n);
  }
  out_.clear();
}

Result<RedisReply> RedisClient::Call(const std::vector<std::string>& args) {
  auto p = std::make_shared<std::promise<Result<RedisReply>>>();
  auto f = p->get_future();
  Send(args, [p](Result<RedisReply> r) { p->set_value(std::move(r)); });
  return f.get();
}

void RedisClient::ReaderMain() {
  std::string buf;
  size_t pos = 0;
  char chunk[65536];
  // Parses one reply at buf[pos..]; returns false when more bytes are needed. Arrays are
  // returned as kArray with their elements skipped (the bench sends no command returning one
  // it needs to read).
  std::function<bool(size_t&, RedisReply&)> parse = [&](size_t& p, RedisReply& r) -> bool {
    size_t eol = buf.find("\r\n", p);
    if (eol == std::string::npos) return false;
    char type = buf[p];
    std::string line = buf.substr(p + 1, eol - p - 1);
    size_t next = eol + 2;
    switch (type) {
      case '+': r.kind = RedisReply::kStatus; r.str = line; break;
      case '-': r.kind = RedisReply::kError; r.str = line; break;
      case ':': r.kind = RedisReply::kInteger; r.integer = std::stoll(line); break;
      case '$': {
        long long n = std::stoll(line);
        if (n < 0) {
          r.kind = RedisReply::kNil;
          break;
        }
        if (buf.size() < next + static_cast<size_t>(n) + 2) return false;
        r.kind = RedisReply::kString;
        r.str = buf.substr(next, static_cast<size_t>(n));
        next += static_cast<size_t>(n) + 2;
        break;
      }
      case '*': {
        long long n = std::stoll(line);
        r.kind = RedisReply::kArray;
        for (long long i = 0; i < n; ++i) {
          RedisReply e;
          if (!parse(next, e)) return false;
        }
        break;
      }
      default:
        r.kind = RedisReply::kError;
        r.str = "bad RESP type";
    }
    p = next;
    return true;
  };
  reader_id_ = std::this_thread::get_id();
  while (true) {
    ssize_t n = ::recv(fd_.get(), chunk, sizeof(chunk), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buf.append(chunk, static_cast<size_t>(n));
    {
      std::lock_guard<std::mutex> lock(mu_);
      batching_ = true;
    }
    while (pos < buf.size()) {
      size_t p = pos;
      RedisReply r;
      if (!parse(p, r)) break;
      pos = p;
      Callback cb;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (pending_.empty()) continue;
        cb = std::move(pending_.front());
        pending_.pop_front();
      }
      if (r.kind == RedisReply::kError) {
        cb(tessera::Internal("redis: ", r.str));
      } else {
        cb(std::move(r));
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      batching_ = false;
      FlushLocked();
    }
    if (pos > 1 << 20) {
      buf.erase(0, pos);
      pos = 0;
    }
  }
  std::deque<Callback> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    down_ = true;
    left.swap(pending_);
  }
  for (auto& cb : left) cb(tessera::Unavailable("redis connection lost"));
}

}  // namespace kayak::bench
