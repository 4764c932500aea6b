// MetricsHttpServer: a tiny HTTP/1.1 server that answers `GET /metrics` with Prometheus text.
//
// It runs on its own thread, serves one connection at a time (a scrape endpoint, not a web
// server), reads each request with a 2 s deadline, and closes every connection after its
// reply. GET /metrics -> 200 with the text from the render callback; other paths -> 404;
// other methods -> 405; anything unparsable -> 400. Port 0 binds an ephemeral port.
//
// Ownership: owns its sockets and thread; the destructor stops and joins. The render callback
// is called on the server's thread and must be thread-safe against the rest of the program.
// Threads: Create/Stop/port from the owning thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/fd.h"
#include "common/status.h"

namespace tessera::memserver {

class MetricsHttpServer {
 public:
  using Render = std::function<std::string()>;

  // Binds host:port and starts serving.
  static Result<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host, uint16_t port,
                                                          Render render);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  uint16_t port() const { return port_; }
  void Stop();

 private:
  MetricsHttpServer(UniqueFd listen_fd, UniqueFd wake_fd, uint16_t port, Render render);
  void Loop();
  void ServeOne(int fd);

  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // eventfd: Stop() wakes the loop.
  uint16_t port_;
  Render render_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace tessera::memserver
