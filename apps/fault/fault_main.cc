// `tessera fault HOST:PORT ACTION [ARGS]`: injects a fault into a running memory server.
#include <gflags/gflags.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "apps/cli/cli.h"
#include "common/units.h"
#include "fabric/auth.h"
#include "fabric/credential.h"
#include "fabric/control_client.h"
#include "memserver/fault_state.h"

DEFINE_string(auth_token_file, "",
              "An admin credential: the cluster secret, or `tessera token issue --admin`; empty: "
              "the development default (logged)");
DEFINE_string(ops, "",
              "Ops a delay/hang/drop applies to: comma list of alloc, free, read, write, stats, "
              "heartbeat, invoke (default read,write)");
DEFINE_string(duration, "", "How long the fault lasts, e.g. 5s (default: until `clear`)");
DEFINE_string(timeout, "5s", "Deadline for connecting and for the server's answer");

namespace {

using tessera::cli::UsageError;
namespace fabric = tessera::fabric;
namespace ms = tessera::memserver;

const tessera::cli::CliSpec kSpec = {
    "tessera fault",
    "HOST:PORT ACTION [ARGS] [--ops LIST] [--duration D] [--auth_token_file F]",
    "Injects a fault into a running memory server (authenticated). ACTION is one of:\n"
    "  clear               remove every injected fault\n"
    "  delay DURATION      delay replies (e.g. delay 200us); --ops chooses which ops\n"
    "  hang                stop answering (the client times out); --ops as above\n"
    "  drop                close the connection of each matching request\n"
    "  crash               abort the server process at once\n"
    "  bitflip N [SLAB]    flip N random bits in slab SLAB or in random allocated slabs\n"
    "  refuse-alloc        answer ALLOC_SLAB with ResourceExhausted\n"
    "  evict N             evict N slabs the normal way (owners notified, then freed)\n"
    "FAULT requests themselves are never delayed, hung or dropped, so `clear` always works.",
    __FILE__, 2, 4};

// The wire's FAULT op carries these kinds; bit flips and refused allocations travel in the
// memserver's built-in fault INVOKE function until FAULT grows them.
bool FitsWireFault(ms::FaultKind k) {
  return k != ms::FaultKind::kBitFlip && k != ms::FaultKind::kRefuseAlloc;
}

fabric::FaultRequest ToWire(const ms::FaultSpec& s) {
  fabric::FaultRequest r;
  switch (s.kind) {
    case ms::FaultKind::kClear: r.action = fabric::FaultAction::kClear; break;
    case ms::FaultKind::kDelay: r.action = fabric::FaultAction::kDelay; break;
    case ms::FaultKind::kHang: r.action = fabric::FaultAction::kHang; break;
    case ms::FaultKind::kDrop: r.action = fabric::FaultAction::kDropConnection; break;
    case ms::FaultKind::kCrash: r.action = fabric::FaultAction::kCrash; break;
    case ms::FaultKind::kEvict: r.action = fabric::FaultAction::kEvictSlabs; break;
    default: break;
  }
  r.op_mask = s.op_mask;
  r.delay_us = (s.delay_ns + 999) / 1000;
  r.duration_ms = (s.duration_ns + 999999) / 1000000;
  r.count = s.count;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  // A one-shot tool: per-connection INFO lines from the transport would only be noise.
  gflags::SetCommandLineOptionWithMode("log_level", "warning", gflags::SET_FLAGS_DEFAULT);
  tessera::cli::InitCli(kSpec, &argc, &argv);
  auto endpoint = fabric::ParseEndpoint(argv[1]);
  if (!endpoint.ok()) UsageError(kSpec, "bad server '" + std::string(argv[1]) + "': " +
                                            endpoint.status().message());
  std::vector<std::string> words(argv + 2, argv + argc);
  auto spec = ms::ParseFaultCommand(words, FLAGS_ops, FLAGS_duration);
  if (!spec.ok()) UsageError(kSpec, spec.status().message());
  auto timeout = tessera::ParseDurationNs(FLAGS_timeout);
  if (!timeout.ok() || *timeout == 0) UsageError(kSpec, "bad --timeout '" + FLAGS_timeout + "'");
  const uint64_t timeout_ms = (*timeout + 999999) / 1000000;

  // Fault injection needs an admin credential: the cluster secret or an admin token.
  auto cred = fabric::LoadCredential(FLAGS_auth_token_file, "tessera fault");
  if (!cred.ok()) {
    std::fprintf(stderr, "tessera fault: %s\n", cred.status().ToString().c_str());
    return 1;
  }
  if (cred->role != fabric::Role::kAdmin) {
    std::fprintf(stderr,
                 "tessera fault: %s is a client credential ('%s'); fault injection needs an "
                 "admin credential: the cluster secret or `tessera token issue --admin`\n",
                 FLAGS_auth_token_file.c_str(), cred->name.c_str());
    return 1;
  }
  fabric::ConnectOptions co;
  co.secret = cred->key;
  co.client_id = cred->client_id != 0
                     ? cred->client_id
                     : std::random_device{}() | (uint64_t{std::random_device{}()} << 32) | 1;
  co.deadline = tessera::Deadline::AfterMs(timeout_ms);
  auto conn = fabric::ControlClient::Connect(*endpoint, co);
  if (!conn.ok()) {
    std::fprintf(stderr, "tessera fault: cannot reach %s: %s\n", endpoint->ToString().c_str(),
                 conn.status().ToString().c_str());
    return 1;
  }
  fabric::ControlClient& control = **conn;
  const std::string name = endpoint->ToString();
  const std::string what(ms::FaultKindName(spec->kind));
  const bool per_op = spec->kind == ms::FaultKind::kDelay || spec->kind == ms::FaultKind::kHang ||
                      spec->kind == ms::FaultKind::kDrop;
  if (per_op && control.rdma_offered()) {
    // The hooks run in the server's request path; RDMA one-sided ops never enter it.
    std::fprintf(stderr,
                 "tessera fault: note: %s serves RDMA: '%s' acts on requests the server's CPU "
                 "handles (TCP data ops and control calls); one-sided RDMA READ/WRITE from verbs "
                 "clients bypass the fault hooks and are not affected\n",
                 name.c_str(), what.c_str());
  }
  tessera::Status st;
  std::string detail;
  if (FitsWireFault(spec->kind)) {
    st = control.Fault(ToWire(*spec), tessera::Deadline::AfterMs(timeout_ms));
  } else {
    std::string args = ms::EncodeFaultSpec(*spec);
    auto r = control.Invoke(
        ms::kFaultFunctionId,
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(args.data()), args.size()),
        tessera::Deadline::AfterMs(timeout_ms));
    st = r.status();
    if (r.ok()) detail.assign(r->begin(), r->end());
  }
  if (spec->kind == ms::FaultKind::kCrash) {
    // The server dies before it can answer: a lost connection is the expected outcome.
    if (st.ok() || st.code() == tessera::StatusCode::kUnavailable ||
        st.code() == tessera::StatusCode::kTimeout) {
      std::printf("%s: crash injected (connection closed)\n", name.c_str());
      return 0;
    }
  }
  if (!st.ok()) {
    std::fprintf(stderr, "tessera fault: %s refused '%s': %s\n", name.c_str(), what.c_str(),
                 st.ToString().c_str());
    return 1;
  }
  if (detail.empty()) {
    detail = what;
    if (spec->kind == ms::FaultKind::kDelay) detail += " " + tessera::FormatDurationNs(spec->delay_ns);
    if (spec->kind == ms::FaultKind::kEvict) detail += " " + std::to_string(spec->count);
    if (!FLAGS_ops.empty()) detail += " ops=" + FLAGS_ops;
    if (!FLAGS_duration.empty()) detail += " for " + FLAGS_duration;
    detail += spec->kind == ms::FaultKind::kClear ? ": all faults removed" : ": injected";
  }
  std::printf("%s: %s\n", name.c_str(), detail.c_str());
  control.Close(tessera::Deadline::AfterMs(timeout_ms)).IgnoreError();
  return 0;
}
