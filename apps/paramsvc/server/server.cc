#include "apps/paramsvc/server/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "apps/paramsvc/server/server_impl.h"
#include "common/logging.h"
#include "common/net.h"
#include "fabric/auth.h"

namespace tessera::paramsvc {

std::vector<uint8_t> EncodePartitionState(const PartitionState& s) {
  const uint32_t n = static_cast<uint32_t>(s.param.size());
  std::vector<uint8_t> out(8 + 8 + 4 + 1 + 1 + 2 +
                           4ull * n * (1 + (s.mom.empty() ? 0 : 1) + (s.mom2.empty() ? 0 : 1)));
  EncodeFixed64(out.data(), s.version);
  EncodeFixed64(out.data() + 8, s.steps);
  EncodeFixed32(out.data() + 16, n);
  out[20] = s.mom.empty() ? 0 : 1;
  out[21] = s.mom2.empty() ? 0 : 1;
  size_t off = 24;
  for (const auto* v : {&s.param, &s.mom, &s.mom2}) {
    if (v->empty()) continue;
    std::memcpy(out.data() + off, v->data(), 4ull * n);
    off += 4ull * n;
  }
  return out;
}

Result<PartitionState> DecodePartitionState(std::span<const uint8_t> b, uint32_t count) {
  if (b.size() < 24) return Corruption("partition state of ", b.size(), " bytes");
  PartitionState s;
  s.version = DecodeFixed64(b.data());
  s.steps = DecodeFixed64(b.data() + 8);
  const uint32_t n = DecodeFixed32(b.data() + 16);
  if (n != count) return Corruption("partition state holds ", n, " elements, expected ", count);
  if (b[20] > 1 || b[21] > 1) return Corruption("partition state flags");
  const size_t want = 24 + 4ull * n * (1 + b[20] + b[21]);
  if (b.size() != want) return Corruption("partition state is ", b.size(), " bytes, expected ", want);
  size_t off = 24;
  auto take = [&](std::vector<float>* v) {
    v->resize(n);
    std::memcpy(v->data(), b.data() + off, 4ull * n);
    off += 4ull * n;
  };
  take(&s.param);
  if (b[20]) take(&s.mom);
  if (b[21]) take(&s.mom2);
  return s;
}

std::vector<uint8_t> EncodeCounters(const JobCounters& c) {
  const uint64_t v[] = {c.pushes,  c.applied,       c.pending,       c.dropped,
                        c.late_aggregated, c.rejected, c.updates, c.staleness_max,
                        c.staleness_sum,   c.migrations, c.parked};
  constexpr size_t kN = sizeof(v) / sizeof(v[0]);
  std::vector<uint8_t> out(8 * kN + 4 + 8 * c.staleness_hist.size());
  for (size_t i = 0; i < kN; ++i) EncodeFixed64(out.data() + 8 * i, v[i]);
  EncodeFixed32(out.data() + 8 * kN, static_cast<uint32_t>(c.staleness_hist.size()));
  for (size_t i = 0; i < c.staleness_hist.size(); ++i) {
    EncodeFixed64(out.data() + 8 * kN + 4 + 8 * i, c.staleness_hist[i]);
  }
  return out;
}

Status DecodeCounters(std::span<const uint8_t> b, JobCounters* c) {
  constexpr size_t kN = 11;
  if (b.size() < 8 * kN + 4) return ProtocolError("counters of ", b.size(), " bytes");
  uint64_t* f[] = {&c->pushes,  &c->applied,       &c->pending,       &c->dropped,
                   &c->late_aggregated, &c->rejected, &c->updates, &c->staleness_max,
                   &c->staleness_sum,   &c->migrations, &c->parked};
  for (size_t i = 0; i < kN; ++i) *f[i] = DecodeFixed64(b.data() + 8 * i);
  const uint32_t n = DecodeFixed32(b.data() + 8 * kN);
  if (n > 2048 || b.size() != 8 * kN + 4 + 8ull * n) {
    return ProtocolError("counters: a histogram of ", n, " buckets in ", b.size(), " bytes");
  }
  c->staleness_hist.resize(n);
  for (uint32_t i = 0; i < n; ++i) c->staleness_hist[i] = DecodeFixed64(b.data() + 8 * kN + 4 + 8 * i);
  return Status::Ok();
}

namespace {
using json = nlohmann::json;

const char* PlaceName(uint8_t p) {
  switch (p) {
    case server_internal::Job::kActive: return "active";
    case server_internal::Job::kFreezing: return "freezing";
    case server_internal::Job::kHandoff: return "handoff";
    case server_internal::Job::kMoved: return "moved";
    case server_internal::Job::kStaged: return "staged";
  }
  return "?";
}
}  // namespace

using namespace server_internal;  // NOLINT(build/namespaces): this file builds them

std::string Server::Impl::StatusJson() {
  json j;
  j["server_id"] = server_id;
  j["pid"] = static_cast<int64_t>(::getpid());
  j["kernel_target"] = KernelTarget();
  j["max_cores"] = max_cores.load();
  j["elastic"] = elastic.load();
  j["target_utilisation"] = opt.target_utilisation;
  j["active_cores"] = active.load();
  j["core_seconds"] = static_cast<double>(core_us.load()) / 1e6;
  j["ns_per_byte"] = ns_per_byte;
  j["checkpoints"] = opt.checkpoint != nullptr;
  j["advertise"] = advertise;
  j["connections"] = nconns.load();
  j["event_loops"] = loops.size();
  {
    std::lock_guard<std::mutex> l(jobs_mu);
    j["draining"] = draining;
    j["drain_to"] = drain_to;
    json mv = json::array();
    for (const auto& [id, r] : moved) {
      mv.push_back({{"job", id}, {"name", r.name}, {"to", r.to}, {"move_id", r.move_id},
                    {"acknowledged", unacked.count(id) == 0}});
    }
    j["moved"] = mv;
  }
  json cs = json::array();
  for (size_t i = 0; i < cores.size(); ++i) {
    std::lock_guard<std::mutex> l(cores[i]->mu);
    cs.push_back({{"core", i},
                  {"busy_s", static_cast<double>(cores[i]->busy_ns.load()) / 1e9},
                  {"queued", cores[i]->q.size()}});
  }
  j["cores"] = cs;
  json js = json::array();
  for (auto& job : AllJobs()) {
    JobCounters c = Sum(*job);
    json pj = json::array();
    uint64_t min_v = UINT64_MAX, max_v = 0;
    for (auto& p : job->parts) {
      std::lock_guard<std::mutex> l(p->mu);
      min_v = std::min(min_v, p->st.version);
      max_v = std::max(max_v, p->st.version);
      pj.push_back({{"partition", p->index},
                    {"tensor", p->info.tensor},
                    {"elements", p->info.count},
                    {"core", p->core.load()},
                    {"version", p->st.version},
                    {"bytes_per_s", p->rate}});
    }
    js.push_back({{"job", job->id},
                  {"name", job->spec.name},
                  {"place", PlaceName(job->place.load())},
                  {"moves", job->moves.load()},
                  {"parked", c.parked},
                  {"model_bytes", [&] {
                     uint64_t b = 0;
                     for (auto& p : job->parts) b += 4ull * p->info.count;
                     return b;
                   }()},
                  {"workers", job->spec.workers},
                  {"mode", ModeName(job->spec.mode)},
                  {"staleness_bound", job->spec.staleness},
                  {"version_min", min_v},
                  {"version_max", max_v},
                  {"pushes", c.pushes},
                  {"applied", c.applied},
                  {"pending", c.pending},
                  {"dropped", c.dropped},
                  {"late_aggregated", c.late_aggregated},
                  {"rejected", c.rejected},
                  {"updates", c.updates},
                  {"staleness_max", c.staleness_max},
                  {"staleness_sum", c.staleness_sum},
                  {"staleness_hist", c.staleness_hist},
                  {"migrations", c.migrations},
                  {"partitions", pj}});
  }
  j["jobs"] = js;
  return j.dump();
}

JobCounters Server::Impl::Sum(Job& job) {
  JobCounters s;
  for (auto& p : job.parts) {
    std::lock_guard<std::mutex> l(p->mu);
    const JobCounters& c = p->c;
    s.pushes += c.pushes;
    s.applied += c.applied;
    s.pending += c.pending;
    s.dropped += c.dropped;
    s.late_aggregated += c.late_aggregated;
    s.rejected += c.rejected;
    s.updates += c.updates;
    s.staleness_max = std::max(s.staleness_max, c.staleness_max);
    s.staleness_sum += c.staleness_sum;
    s.migrations += c.migrations;
    s.parked += c.parked;
    if (s.staleness_hist.size() < c.staleness_hist.size()) {
      s.staleness_hist.resize(c.staleness_hist.size(), 0);
    }
    for (size_t i = 0; i < c.staleness_hist.size(); ++i) s.staleness_hist[i] += c.staleness_hist[i];
  }
  return s;
}

Result<UniqueFd> Server::Listen(const std::string& host, uint16_t port) {
  // An address, not a name: the service says where it listens in the form it was given.
  std::string h = host;
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  in6_addr a6;
  in_addr a4;
  if (::inet_pton(AF_INET6, h.c_str(), &a6) != 1 && ::inet_pton(AF_INET, h.c_str(), &a4) != 1) {
    return InvalidArgument("bad listen address '", host, "' (want an IPv4 or IPv6 address)");
  }
  return ListenTcp(h, port);
}

Result<std::unique_ptr<Server>> Server::Start(const ServerOptions& options, UniqueFd listen_fd) {
  if (options.max_cores < 1 || options.max_cores > 256) {
    return InvalidArgument("max_cores ", options.max_cores, " not in 1..256");
  }
  if (!(options.target_utilisation > 0 && options.target_utilisation <= 1)) {
    return InvalidArgument("target_utilisation ", options.target_utilisation, " not in (0, 1]");
  }
  if (options.rebalance_ms < 10 || options.rebalance_ms > 60000) {
    return InvalidArgument("rebalance_ms ", options.rebalance_ms, " not in 10..60000");
  }
  if (options.nice < 0 || options.nice > 19) return InvalidArgument("nice ", options.nice, " not in 0..19");
  if (options.secret.empty()) return InvalidArgument("a shared secret is required");
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  impl->listen_fd = std::move(listen_fd);
  impl->wake_fd.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!impl->wake_fd) return ErrnoError("eventfd");
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (::getsockname(impl->listen_fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    return ErrnoError("getsockname");
  }
  const bool v6 = a.ss_family == AF_INET6;
  const auto* a4 = reinterpret_cast<const sockaddr_in*>(&a);
  const auto* a6 = reinterpret_cast<const sockaddr_in6*>(&a);
  impl->port = ntohs(v6 ? a6->sin6_port : a4->sin_port);
  // The accepting loops take connections without blocking.
  const int fl = ::fcntl(impl->listen_fd.get(), F_GETFL);
  if (fl < 0 || ::fcntl(impl->listen_fd.get(), F_SETFL, fl | O_NONBLOCK) != 0) {
    return ErrnoError("fcntl(O_NONBLOCK) on the listening socket");
  }
  impl->server_id = options.server_id;
  if (impl->server_id == 0) {
    uint8_t r[8];
    if (!fabric::RandomBytes(r).ok()) return Internal("no randomness");
    impl->server_id = DecodeFixed64(r) | 1;
  }
  impl->advertise = options.advertise;
  if (impl->advertise.empty()) {
    char host[INET6_ADDRSTRLEN] = {};
    if (v6) {
      ::inet_ntop(AF_INET6, &a6->sin6_addr, host, sizeof(host));
      if (!IN6_IS_ADDR_UNSPECIFIED(&a6->sin6_addr)) {
        impl->advertise = "[" + std::string(host) + "]:" + std::to_string(impl->port);
      }
    } else {
      ::inet_ntop(AF_INET, &a4->sin_addr, host, sizeof(host));
      if (a4->sin_addr.s_addr != htonl(INADDR_ANY)) {
        impl->advertise = std::string(host) + ":" + std::to_string(impl->port);
      }
    }
  } else if (Status e = CheckEndpointText(impl->advertise, "advertise"); !e.ok()) {
    return e;
  }
  impl->max_cores = options.max_cores;
  impl->elastic = options.elastic;
  impl->active = options.elastic ? 0 : options.max_cores;
  Impl* raw = impl.get();
  for (int i = 0; i < options.max_cores; ++i) impl->cores.push_back(std::make_unique<Core>());
  for (int i = 0; i < options.max_cores; ++i) {
    impl->cores[i]->th = std::thread([raw, i] { raw->CoreLoop(i); });
  }
  impl->timer = std::thread([raw] { raw->TimerLoop(); });
  if (options.checkpoint) impl->ckpt = std::thread([raw] { raw->CheckpointLoop(); });
  impl->mover = std::thread([raw] { raw->MoverLoop(); });
  std::unique_ptr<Server> server(new Server(std::move(impl)));  // Its destructor stops them all.
  int loops = options.event_loops;
  if (loops == 0) loops = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 8);
  if (Status s = raw->StartLoops(loops); !s.ok()) return s;
  if (options.accept_on_start) {
    if (Status s = raw->StartAcceptingLoops(); !s.ok()) return s;
  }
  return server;
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  Impl& m = *impl_;
  m.stop = true;
  uint64_t one = 1;
  (void)!::write(m.wake_fd.get(), &one, sizeof(one));
  m.StopLoops();  // No request is read after this; admin requests have ended.
  if (m.timer.joinable()) m.timer.join();
  m.ckpt_cv.notify_all();
  if (m.ckpt.joinable()) m.ckpt.join();
  {
    std::lock_guard<std::mutex> l(m.mover_mu);
  }
  m.mover_cv.notify_all();
  if (m.mover.joinable()) m.mover.join();
  for (auto& c : m.cores) {
    { std::lock_guard<std::mutex> l(c->mu); }
    c->cv.notify_all();
  }
  for (auto& c : m.cores) {
    if (c->th.joinable()) c->th.join();
  }
}

uint16_t Server::port() const { return impl_->port; }

void Server::StartAccepting() {
  if (Status s = impl_->StartAcceptingLoops(); !s.ok()) {
    TLOG(ERROR) << "paramsvc: cannot accept connections: " << s.ToString();
  }
}

Status Server::RestoreJob(uint32_t job, const JobSpec& spec, std::vector<PartitionState> states,
                          uint64_t staged_move, const std::string& source) {
  Status v = spec.Validate();
  if (!v.ok()) return v;
  std::lock_guard<std::mutex> l(impl_->jobs_mu);
  if (impl_->jobs.count(job) || impl_->job_by_name.count(spec.name) || impl_->moved.count(job)) {
    return AlreadyExists("job ", job, " ('", spec.name, "') exists");
  }
  auto j = impl_->MakeJob(job, spec, std::move(states));
  if (!j.ok()) return j.status();
  if (staged_move != 0) {
    (*j)->place = Impl::Job::kStaged;
    (*j)->move_id = staged_move;
    (*j)->peer = source;
    (*j)->prepared = true;
    (*j)->staged_touch_ns = 0;  // Ask the source at once.
  }
  impl_->jobs[job] = *j;
  impl_->job_by_name[spec.name] = job;
  impl_->next_job = std::max(impl_->next_job, job + 1);
  return Status::Ok();
}

Status Server::RestoreMoved(const MovedRecord& r) {
  std::lock_guard<std::mutex> l(impl_->jobs_mu);
  if (impl_->jobs.count(r.job) || impl_->moved.count(r.job)) {
    return AlreadyExists("job ", r.job, " ('", r.name, "') exists");
  }
  impl_->moved[r.job] = r;
  if (!impl_->job_by_name.count(r.name)) impl_->moved_by_name[r.name] = r.job;
  // Sent again: the restart may have come before D heard it (not to itself: an old id of a
  // job that came back here).
  if (r.to != impl_->advertise) impl_->unacked[r.job] = true;
  impl_->next_job = std::max(impl_->next_job, r.job + 1);
  impl_->mover_cv.notify_all();
  return Status::Ok();
}

void Server::RestoreDrain(bool on, const std::string& redirect) {
  std::lock_guard<std::mutex> l(impl_->jobs_mu);
  impl_->draining = on;
  impl_->drain_to = on ? redirect : std::string();
}

std::string Server::StatusJson() const { return impl_->StatusJson(); }

Result<JobCounters> Server::Counters(uint32_t job) const {
  auto j = impl_->FindJob(job);
  if (!j) return NotFound("unknown job ", job);
  return Impl::Sum(*j);
}

int Server::active_cores() const { return impl_->active.load(); }
double Server::core_seconds() const { return static_cast<double>(impl_->core_us.load()) / 1e6; }

double Server::core_cpu_seconds() const {
  double s = 0;
  for (auto& c : impl_->cores) {
    if (!c->has_clock.load()) continue;
    timespec ts;
    if (clock_gettime(c->cpu_clock, &ts) == 0) s += ts.tv_sec + ts.tv_nsec / 1e9;
  }
  return s;
}

}  // namespace tessera::paramsvc
