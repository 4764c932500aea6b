// libFuzzer target for the stateful memory server: the real network engine (fabric/server.h)
// with the real memserver handler (slabs, quota, leases) and the Kayak service (KV tables,
// offload functions) registered as a memserver daemon registers it, started
// once in this process on loopback. Every input is one client connection:
//
//   byte 0   mode: bit 0 = the harness first runs a real handshake with a client token, so the
//            rest reaches the authenticated paths (ALLOC/FREE, READ/WRITE, READV/WRITEV, STATS,
//            HEARTBEAT, INVOKE, KV); bit 1 = that handshake also sends an instance id.
//   byte 1   seed of the cutting: the rest is sent in chunks of 1..512 bytes drawn from it, so
//            frames (and handshake frames) arrive split across sends.
//   rest     the byte stream, as a peer would send it.
//
// The harness drains replies while it sends (a peer that reads), half-closes, reads until the
// server closes or 2 s pass, then frees the slabs the input left behind (the lease of its
// owner) and checks that a separate long-lived client still gets a heartbeat: a server that
// stops answering aborts the run. Fault injection is off (FAULT cannot crash the process).
// Built with clang -fsanitize=fuzzer when TESSERA_FUZZ=ON; always built into
// memserver_server_fuzz_test (a bounded run for CI, tests/support/fuzz_smoke.h).
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "apps/kayak/server/kv_service.h"
#include "common/clock.h"
#include "common/fd.h"
#include "fabric/connect.h"
#include "fabric/control_client.h"
#include "fabric/credential.h"
#include "memserver/daemon.h"

namespace {

using namespace tessera;

constexpr char kSecret[] = "server-fuzzer-cluster-secret-0123456789";

struct Harness {
  std::unique_ptr<memserver::MemServerDaemon> daemon;
  std::unique_ptr<fabric::ControlClient> keepalive;
  fabric::Credential token;
  fabric::Endpoint endpoint;
};

Harness* Get() {
  static Harness* h = [] {
    auto* x = new Harness;
    memserver::DaemonOptions o;
    o.listen_host = "127.0.0.1";
    o.port = 0;
    o.capacity_bytes = 4u << 20;
    o.slab_bytes = 64u << 10;
    o.headroom_bytes = 0;
    o.transport = fabric::TransportKind::kTcp;
    o.secret = kSecret;
    o.orphan_grace_ns = 1;  // Freed by the harness's reclaim after each input.
    o.max_slabs_per_client = 16;
    o.handshake_timeout_ms = 2000;
    o.service_cpu.workers = 1;
    o.services.push_back(kayak::Plugin(kayak::OffloadOptions{}));
    auto d = memserver::MemServerDaemon::Start(o);
    if (!d.ok()) {
      std::fprintf(stderr, "server fuzzer: %s\n", d.status().ToString().c_str());
      std::abort();
    }
    x->daemon = std::move(*d);
    x->endpoint = fabric::Endpoint{"127.0.0.1", x->daemon->port()};
    auto tok = fabric::IssueCredential(kSecret, "fuzz", fabric::Role::kClient);
    if (!tok.ok()) std::abort();
    x->token = *tok;
    fabric::ConnectOptions co;
    co.secret = kSecret;
    co.client_id = 1;
    auto k = fabric::ControlClient::Connect(x->endpoint, co);
    if (!k.ok()) std::abort();
    x->keepalive = std::move(*k);
    return x;
  }();
  return h;
}

void Drain(int fd) {
  uint8_t buf[65536];
  while (::recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0) {
  }
}

}  // namespace

// Stops the server and its threads (the bounded CI run calls it before the process exits, so no
// server thread outlives static destruction; libFuzzer never does).
void ShutdownServerFuzzHarness() {
  Harness* h = Get();
  h->keepalive.reset();
  h->daemon->Shutdown();
  h->daemon.reset();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Harness* h = Get();
  if (size < 2) return 0;
  const uint8_t mode = data[0];
  uint32_t cut = data[1] * 2654435761u + 1;
  data += 2;
  size -= 2;

  UniqueFd fd;
  if (mode & 1) {
    fabric::ConnectOptions co;
    co.secret = h->token.key;
    co.client_id = h->token.client_id;
    co.instance_id = (mode & 2) ? 0x5eed : 0;
    co.deadline = Deadline::AfterMs(5000);
    auto s = fabric::ConnectAndAuthenticate(h->endpoint, co);
    if (!s.ok()) return 0;  // E.g. the per-client connection limit: fine.
    fd = std::move(s->fd);
  } else {
    auto c = fabric::ConnectTcp(h->endpoint, Deadline::AfterMs(5000));
    if (!c.ok()) return 0;
    fd = std::move(*c);
  }
  // Send in chunks, reading replies meanwhile; stop when the server closes.
  size_t off = 0;
  const Deadline send_deadline = Deadline::AfterMs(5000);
  bool open = true;
  while (off < size && open && !send_deadline.Expired()) {
    cut = cut * 1103515245u + 12345u;
    const size_t n = std::min<size_t>(size - off, 1 + (cut >> 16) % 512);
    pollfd p{fd.get(), POLLOUT | POLLIN, 0};
    if (::poll(&p, 1, 100) < 0) break;
    if (p.revents & (POLLERR | POLLHUP)) break;
    if (p.revents & POLLIN) Drain(fd.get());
    if (p.revents & POLLOUT) {
      ssize_t k = ::send(fd.get(), data + off, n, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k < 0 && errno != EAGAIN && errno != EINTR) open = false;
      if (k > 0) off += static_cast<size_t>(k);
    }
  }
  ::shutdown(fd.get(), SHUT_WR);
  const Deadline read_deadline = Deadline::AfterMs(2000);
  uint8_t buf[65536];
  while (!read_deadline.Expired()) {
    pollfd p{fd.get(), POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    ssize_t k = ::recv(fd.get(), buf, sizeof buf, 0);
    if (k <= 0) break;
  }
  fd.Reset();
  h->daemon->handler().ReclaimOrphans(MonotonicNs() + 1000000000ull);
  auto hb = h->keepalive->Heartbeat(Deadline::AfterMs(10000));
  if (!hb.ok()) {
    std::fprintf(stderr, "server fuzzer: the server stopped answering: %s\n",
                 hb.status().ToString().c_str());
    std::abort();
  }
  return 0;
}
