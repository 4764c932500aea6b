#include "bench/failover/etcd_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "common/clock.h"
#include "membership/etcd_client.h"

namespace tessera::bench {
namespace {

constexpr const char* kEtcd = "/usr/bin/etcd";

// A port the kernel just handed out (closed again; etcd binds it right after).
Result<int> FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return ErrnoError("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    Status st = ErrnoError("bind");
    ::close(fd);
    return st;
  }
  ::close(fd);
  return static_cast<int>(ntohs(a.sin_port));
}

}  // namespace

std::string EtcdServer::MissingReason() {
  if (::access(kEtcd, X_OK) != 0) {
    return std::string(kEtcd) + " not found (Debian package etcd-server)";
  }
  return "";
}

Result<std::unique_ptr<EtcdServer>> EtcdServer::Start() {
  if (std::string why = MissingReason(); !why.empty()) return Unsupported(why);
  std::unique_ptr<EtcdServer> e(new EtcdServer());
  std::string tmpl = (std::filesystem::temp_directory_path() / "tessera-etcd-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) return ErrnoError("mkdtemp ", tmpl);
  e->dir_ = tmpl;
  Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {  // A port taken meanwhile: new ports.
    TESSERA_ASSIGN_OR_RETURN(e->client_port_, FreePort());
    TESSERA_ASSIGN_OR_RETURN(e->peer_port_, FreePort());
    e->endpoint_ = "127.0.0.1:" + std::to_string(e->client_port_);
    last = e->Launch();
    if (last.ok()) return e;
    if (e->proc_.running()) {
      (void)e->proc_.Signal(SIGKILL);
      (void)e->proc_.Wait(Deadline::AfterMs(10000));
    }
    std::error_code ec;
    std::filesystem::remove_all(e->dir_ + "/data", ec);
  }
  return last;
}

EtcdServer::~EtcdServer() {
  if (proc_.running()) {
    if (paused_) (void)proc_.Signal(SIGCONT);
    (void)proc_.Signal(SIGKILL);
    (void)proc_.Wait(Deadline::AfterMs(10000));
  }
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

Status EtcdServer::Launch() {
  const std::string client = "http://" + endpoint_;
  const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
  Subprocess::Options so;
  so.quiet_stderr = true;
  so.own_process_group = true;
  TESSERA_ASSIGN_OR_RETURN(
      proc_,
      Subprocess::Start({kEtcd, "--name=failover", "--data-dir=" + dir_ + "/data",
                         "--listen-client-urls=" + client, "--advertise-client-urls=" + client,
                         "--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
                         "--initial-cluster=failover=" + peer, "--logger=zap",
                         "--log-outputs=" + dir_ + "/etcd.log"},
                        so));
  membership::EtcdOptions o;
  o.endpoints = {endpoint_};
  o.connect_timeout_ms = 200;
  o.request_timeout_ms = 500;
  TESSERA_ASSIGN_OR_RETURN(auto c, membership::EtcdClient::Create(o));
  const Deadline d = Deadline::AfterMs(15000);
  Status st;
  while (!d.Expired()) {
    if (proc_.Poll()) return Unavailable("etcd exited at start (log: ", dir_, "/etcd.log)");
    auto r = c->Get("/health-probe");
    if (r.ok()) return Status::Ok();
    st = r.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(30));  // Poll interval.
  }
  return Timeout("etcd did not answer within 15 s: ", st.ToString());
}

Status EtcdServer::Pause() {
  TESSERA_RETURN_IF_ERROR(proc_.Signal(SIGSTOP));
  paused_ = true;
  return Status::Ok();
}

Status EtcdServer::Resume() {
  TESSERA_RETURN_IF_ERROR(proc_.Signal(SIGCONT));
  paused_ = false;
  return Status::Ok();
}

}  // namespace tessera::bench
