#include "tests/support/etcd_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "common/clock.h"
#include "fabric/connect.h"
#include "membership/etcd_client.h"

namespace tessera::testing {
namespace {

constexpr const char* kEtcd = "/usr/bin/etcd";

Result<int> FreePort() {
  TESSERA_ASSIGN_OR_RETURN(uint16_t port, fabric::PickListenPort());
  return static_cast<int>(port);
}

}  // namespace

std::string EtcdProcess::SkipReason() {
  if (::access(kEtcd, X_OK) != 0) {
    return std::string(kEtcd) + " not found: install the Debian package 'etcd-server'";
  }
  return "";
}

Result<std::unique_ptr<EtcdProcess>> EtcdProcess::Start() {
  std::unique_ptr<EtcdProcess> e(new EtcdProcess());
  Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    TESSERA_ASSIGN_OR_RETURN(e->client_port_, FreePort());
    TESSERA_ASSIGN_OR_RETURN(e->peer_port_, FreePort());
    e->endpoint_ = "127.0.0.1:" + std::to_string(e->client_port_);
    last = e->Launch();
    if (last.ok()) return e;
    (void)e->Kill();
    ::system(("rm -rf '" + e->dir_.path() + "/data'").c_str());
  }
  return last;
}

EtcdProcess::~EtcdProcess() { (void)Kill(); }

Status EtcdProcess::Launch() {
  Subprocess::Options so;
  so.quiet_stderr = true;
  so.own_process_group = true;
  std::vector<std::string> argv = membership::SingleEtcdArgs(
      "test", dir_.path() + "/data", client_port_, peer_port_, dir_.path() + "/etcd.log");
  argv[0] = kEtcd;
  TESSERA_ASSIGN_OR_RETURN(proc_, Subprocess::Start(argv, so));
  Status st = membership::WaitForEtcd(endpoint_, 15000,
                                      [&] { return !proc_.running() || proc_.Poll(); });
  if (st.code() == StatusCode::kUnavailable) {
    return Unavailable("etcd exited at start (log: ", dir_.path(), "/etcd.log): ",
                       ReadFile(dir_.path() + "/etcd.log").substr(0, 2000));
  }
  return st;
}

Status EtcdProcess::Kill() {
  if (!proc_.running()) return Status::Ok();
  TESSERA_RETURN_IF_ERROR(proc_.Signal(SIGKILL));
  auto w = proc_.Wait(Deadline::AfterMs(10000));
  return w.ok() ? Status::Ok() : w.status();
}

Status EtcdProcess::Restart() {
  TESSERA_RETURN_IF_ERROR(Kill());
  return Launch();
}

}  // namespace tessera::testing
