// A C API over the Parameter Service client, for the Python package (ctypes) and any language
// with a C FFI. One handle per worker; a handle is not thread-safe. Errors: functions return 0
// on success, a negative StatusCode on failure; tps_last_error() gives the message of the last
// failure on this thread.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "apps/paramsvc/client/client.h"
#include "fabric/credential.h"

namespace {
thread_local std::string g_error;

int Fail(const tessera::Status& s) {
  g_error = s.ToString();
  return -static_cast<int>(s.code());
}

struct Handle {
  std::unique_ptr<tessera::paramsvc::Client> client;
};
}  // namespace

extern "C" {

const char* tps_last_error() { return g_error.c_str(); }

// Connects; reconnect_ms > 0 makes the client ride out a restart of the aggregation server.
void* tps_connect(const char* host, int port, const char* secret, int timeout_ms, int reconnect_ms) {
  tessera::paramsvc::ClientOptions o;
  o.host = host;
  if (port <= 0 || port > 65535) {
    g_error = "bad port";
    return nullptr;
  }
  o.port = static_cast<uint16_t>(port);
  o.secret = secret;
  // The text of a per-client credential file (`tessera token issue`) instead of the cluster
  // secret: authenticate with its key, as its client id (fabric/credential.h).
  if (std::strstr(secret, tessera::fabric::kCredentialMagic.data()) != nullptr) {
    auto cred = tessera::fabric::ParseCredential(secret, "tps_connect's secret");
    if (!cred.ok()) {
      Fail(cred.status());
      return nullptr;
    }
    o.secret = cred->key;
    o.client_id = cred->client_id;
  }
  o.op_timeout_ms = timeout_ms;
  o.reconnect_ms = reconnect_ms;
  auto c = tessera::paramsvc::Client::Connect(o);
  if (!c.ok()) {
    Fail(c.status());
    return nullptr;
  }
  auto* h = new Handle;
  h->client = std::move(*c);
  return h;
}

void tps_close(void* h) { delete static_cast<Handle*>(h); }

// Registers/joins the job described by `spec_json` (see JobSpecFromJson) as worker `rank`.
int tps_join(void* h, const char* spec_json, int rank) {
  auto spec = tessera::paramsvc::JobSpecFromJson(spec_json);
  if (!spec.ok()) return Fail(spec.status());
  if (rank < 0) return Fail(tessera::InvalidArgument("negative rank"));
  tessera::Status s = static_cast<Handle*>(h)->client->Join(*spec, static_cast<uint32_t>(rank));
  return s.ok() ? 0 : Fail(s);
}

int tps_num_tensors(void* h) {
  return static_cast<int>(static_cast<Handle*>(h)->client->spec().tensors.size());
}

int tps_set_params(void* h, const void* const* params) {
  auto* c = static_cast<Handle*>(h)->client.get();
  tessera::Status s = c->SetParams({params, c->spec().tensors.size()});
  if (s.code() == tessera::StatusCode::kAlreadyExists) return 1;  // Already trained: pull instead.
  return s.ok() ? 0 : Fail(s);
}

int tps_push_pull(void* h, const void* const* grads, void* const* params) {
  auto* c = static_cast<Handle*>(h)->client.get();
  const size_t n = c->spec().tensors.size();
  tessera::Status s = c->PushPull({grads, n}, {params, n});
  return s.ok() ? 0 : Fail(s);
}

int tps_push(void* h, const void* const* grads) {
  auto* c = static_cast<Handle*>(h)->client.get();
  tessera::Status s = c->Push({grads, c->spec().tensors.size()});
  return s.ok() ? 0 : Fail(s);
}

int tps_pull(void* h, void* const* params, int wait) {
  auto* c = static_cast<Handle*>(h)->client.get();
  tessera::Status s = c->Pull({params, c->spec().tensors.size()}, wait != 0);
  return s.ok() ? 0 : Fail(s);
}

int tps_barrier(void* h, unsigned long long iteration) {
  tessera::Status s = static_cast<Handle*>(h)->client->Barrier(iteration);
  return s.ok() ? 0 : Fail(s);
}

int tps_set_lr(void* h, double lr) {
  tessera::Status s = static_cast<Handle*>(h)->client->SetLr(static_cast<float>(lr));
  return s.ok() ? 0 : Fail(s);
}

int tps_release(void* h) {
  tessera::Status s = static_cast<Handle*>(h)->client->Release();
  return s.ok() ? 0 : Fail(s);
}

// Fills counters[8]: pushes, applied, dropped, late, max_staleness, rollbacks, reconnects,
// redirects.
void tps_counters(void* h, unsigned long long* out) {
  const auto& c = static_cast<Handle*>(h)->client->counters();
  const unsigned long long v[8] = {c.pushes, c.applied, c.dropped, c.late, c.max_staleness,
                                   c.rollbacks, c.reconnects, c.redirects};
  std::memcpy(out, v, sizeof(v));
}

// The server the client talks to now (it changes when the job moves): "HOST:PORT" into buf.
void tps_endpoint(void* h, char* buf, int len) {
  auto* c = static_cast<Handle*>(h)->client.get();
  const std::string e = c->host() + ":" + std::to_string(c->port());
  if (len > 0) {
    const size_t n = std::min<size_t>(e.size(), static_cast<size_t>(len - 1));
    std::memcpy(buf, e.data(), n);
    buf[n] = '\0';
  }
}

int tps_num_partitions(void* h) {
  return static_cast<int>(static_cast<Handle*>(h)->client->layout().partitions.size());
}

// The job's optimizer state into per-tensor fp32 buffers of elements() values each: params[t]
// (the service's fp32 parameters), mom[t] (SGD momentum or Adam's m) and mom2[t] (Adam's v);
// a null buffer is skipped. has_mom[t] / has_mom2[t]: whether any partition of tensor t keeps
// that state (a partition without it leaves its elements untouched: the caller zeroes them).
// versions[i] and steps[i] per partition (tps_num_partitions).
int tps_get_state(void* h, float* const* params, float* const* mom, float* const* mom2,
                  int* has_mom, int* has_mom2, unsigned long long* versions,
                  unsigned long long* steps) {
  auto* c = static_cast<Handle*>(h)->client.get();
  std::vector<tessera::paramsvc::PartitionState> st;
  tessera::Status s = c->GetState(&st);
  if (!s.ok()) return Fail(s);
  const size_t nt = c->spec().tensors.size();
  for (size_t t = 0; t < nt; ++t) has_mom[t] = has_mom2[t] = 0;
  for (size_t i = 0; i < st.size(); ++i) {
    const auto& pi = c->layout().partitions[i];
    auto copy = [&](float* const* dst, const std::vector<float>& v, int* has) {
      if (v.empty()) return;
      if (has) has[pi.tensor] = 1;
      if (dst && dst[pi.tensor]) std::memcpy(dst[pi.tensor] + pi.offset, v.data(), 4ull * pi.count);
    };
    copy(params, st[i].param, nullptr);
    copy(mom, st[i].mom, has_mom);
    copy(mom2, st[i].mom2, has_mom2);
    versions[i] = st[i].version;
    steps[i] = st[i].steps;
  }
  return 0;
}

// Restores the job's state (at an iteration boundary): per-tensor fp32 params[t], and mom[t] /
// mom2[t] or null (no such state), per-partition versions and steps.
int tps_put_state(void* h, const float* const* params, const float* const* mom,
                  const float* const* mom2, const unsigned long long* versions,
                  const unsigned long long* steps) {
  auto* c = static_cast<Handle*>(h)->client.get();
  std::vector<tessera::paramsvc::PartitionState> st(c->layout().partitions.size());
  for (size_t i = 0; i < st.size(); ++i) {
    const auto& pi = c->layout().partitions[i];
    auto take = [&](const float* const* src, std::vector<float>* v) {
      if (!src || !src[pi.tensor]) return;
      v->assign(src[pi.tensor] + pi.offset, src[pi.tensor] + pi.offset + pi.count);
    };
    take(params, &st[i].param);
    take(mom, &st[i].mom);
    take(mom2, &st[i].mom2);
    st[i].version = versions[i];
    st[i].steps = steps[i];
  }
  tessera::Status s = c->PutState(st);
  return s.ok() ? 0 : Fail(s);
}

unsigned long long tps_min_version(void* h) { return static_cast<Handle*>(h)->client->min_version(); }

// The service's STATUS JSON into buf (truncated to len-1); returns the full length or < 0.
long long tps_status(void* h, char* buf, long long len) {
  auto r = static_cast<Handle*>(h)->client->StatusJson();
  if (!r.ok()) return Fail(r.status());
  if (len > 0) {
    const size_t n = std::min<size_t>(r->size(), static_cast<size_t>(len - 1));
    std::memcpy(buf, r->data(), n);
    buf[n] = '\0';
  }
  return static_cast<long long>(r->size());
}

}  // extern "C"
