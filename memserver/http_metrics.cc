#include "memserver/http_metrics.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <cstring>

#include "common/clock.h"
#include "common/logging.h"
#include "common/net.h"

namespace tessera::memserver {
namespace {

constexpr size_t kMaxRequest = 8192;
constexpr int kRequestDeadlineMs = 2000;

void SendAll(int fd, const std::string& data) {
  size_t off = 0;
  Deadline deadline = Deadline::AfterMs(kRequestDeadlineMs);
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      int ms = deadline.RemainingMs();
      if (ms == 0 || ::poll(&p, 1, ms) <= 0) return;
      continue;
    }
    return;
  }
}

std::string Response(int code, const char* reason, const std::string& body,
                     const char* content_type = "text/plain; charset=utf-8") {
  std::string r = "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\n";
  r += "Content-Type: ";
  r += content_type;
  r += "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  r += body;
  return r;
}

}  // namespace

Result<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(const std::string& host,
                                                                    uint16_t port,
                                                                    Render render) {
  ListenOptions o;
  o.backlog = 16;
  o.what = "metrics endpoint";
  TESSERA_ASSIGN_OR_RETURN(UniqueFd fd, ListenTcp(host, port, o));
  const uint16_t bound = BoundPort(fd.get());
  if (bound == 0) return ErrnoError("getsockname");
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake) return ErrnoError("eventfd");
  auto server = std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(std::move(fd), std::move(wake), bound, std::move(render)));
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

MetricsHttpServer::MetricsHttpServer(UniqueFd listen_fd, UniqueFd wake_fd, uint16_t port,
                                     Render render)
    : listen_fd_(std::move(listen_fd)), wake_fd_(std::move(wake_fd)), port_(port),
      render_(std::move(render)) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  if (stop_.exchange(true)) {
    if (thread_.joinable()) thread_.join();
    return;
  }
  uint64_t one = 1;
  ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
  (void)n;
  if (thread_.joinable()) thread_.join();
}

void MetricsHttpServer::Loop() {
  while (!stop_.load()) {
    pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
    int n = ::poll(fds, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      TLOG(ERROR) << "metrics endpoint poll failed: " << std::strerror(errno);
      return;
    }
    if (fds[1].revents) return;
    if (!(fds[0].revents & POLLIN)) continue;
    UniqueFd conn(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!conn) continue;
    ServeOne(conn.get());
  }
}

void MetricsHttpServer::ServeOne(int fd) {
  std::string req;
  Deadline deadline = Deadline::AfterMs(kRequestDeadlineMs);
  char buf[2048];
  while (req.find("\r\n\r\n") == std::string::npos && req.find("\n\n") == std::string::npos) {
    if (req.size() > kMaxRequest) {
      SendAll(fd, Response(431, "Request Header Fields Too Large", "request too large\n"));
      return;
    }
    pollfd p[2] = {{fd, POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
    int ms = deadline.RemainingMs();
    if (ms == 0) return;  // Slow or silent client: drop it.
    int n = ::poll(p, 2, ms);
    if (n <= 0 || p[1].revents) return;
    ssize_t r = ::recv(fd, buf, sizeof(buf), 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) return;
    req.append(buf, static_cast<size_t>(r));
  }
  size_t eol = req.find('\n');
  std::string line = req.substr(0, eol);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  size_t sp1 = line.find(' ');
  size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string::npos || sp2 == std::string::npos ||
      line.compare(sp2 + 1, 5, "HTTP/") != 0) {
    SendAll(fd, Response(400, "Bad Request", "bad request line\n"));
    return;
  }
  std::string method = line.substr(0, sp1);
  std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  size_t q = path.find('?');
  if (q != std::string::npos) path.resize(q);
  if (method != "GET" && method != "HEAD") {
    SendAll(fd, Response(405, "Method Not Allowed", "only GET is supported\n"));
    return;
  }
  if (path != "/metrics") {
    SendAll(fd, Response(404, "Not Found", "try /metrics\n"));
    return;
  }
  std::string body = render_();
  std::string resp = Response(200, "OK", body, "text/plain; version=0.0.4; charset=utf-8");
  if (method == "HEAD") resp.resize(resp.size() - body.size());
  SendAll(fd, resp);
}

}  // namespace tessera::memserver
