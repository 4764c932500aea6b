#include "apps/experiment/child_processes.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <vector>

#include "apps/experiment/tools.h"
#include "apps/experiment/workload.h"
#include "client/remote_store.h"
#include "common/clock.h"
#include "fabric/connect.h"
#include "membership/etcd_client.h"

namespace tessera::experiment {

// ---- ForkThread ----

ForkThread::ForkThread() : thread_([this] { Loop(); }) {}

ForkThread::~ForkThread() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Status ForkThread::Run(const std::function<Status()>& fn) {
  std::unique_lock<std::mutex> l(mu_);
  job_ = &fn;
  done_ = false;
  cv_.notify_all();
  cv_.wait(l, [&] { return done_; });
  return result_;
}

void ForkThread::Loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    cv_.wait(l, [&] { return stop_ || job_ != nullptr; });
    if (job_ == nullptr) return;  // stop_
    const std::function<Status()>* job = job_;
    l.unlock();
    Status st = (*job)();
    l.lock();
    result_ = st;
    job_ = nullptr;
    done_ = true;
    cv_.notify_all();
  }
}

// ---- EtcdServer ----

namespace {

// `name` in PATH, or "".
std::string FindProgram(const std::string& name) {
  const char* path = ::getenv("PATH");
  std::istringstream in(path != nullptr ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(in, dir, ':')) {
    const std::string p = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

Status Reap(Subprocess& p) {
  if (!p.running()) return Status::Ok();
  ::kill(p.pid(), SIGCONT);  // A stopped process dies of SIGKILL anyway; this keeps it simple.
  TESSERA_RETURN_IF_ERROR(p.Signal(SIGKILL));
  auto w = p.Wait(Deadline::AfterMs(10000));
  return w.ok() ? Status::Ok() : w.status();
}

}  // namespace

Result<std::unique_ptr<EtcdServer>> EtcdServer::Start(const std::string& log_path) {
  if (FindProgram("etcd").empty()) {
    return Unavailable("membership = \"etcd\" needs the etcd program in PATH (Debian package "
                       "etcd-server; scripts/setup.sh installs it)");
  }
  std::unique_ptr<EtcdServer> e(new EtcdServer());
  std::string tmpl = std::filesystem::temp_directory_path().string() + "/tessera-exp-etcd-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return ErrnoError("mkdtemp for etcd's data");
  e->dir_ = tmpl;
  e->log_path_ = log_path;
  Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {  // A picked port may be taken meanwhile.
    TESSERA_ASSIGN_OR_RETURN(uint16_t client_port, fabric::PickListenPort());
    TESSERA_ASSIGN_OR_RETURN(uint16_t peer_port, fabric::PickListenPort());
    e->endpoint_ = "127.0.0.1:" + std::to_string(client_port);
    e->client_port_ = client_port;
    e->peer_port_ = peer_port;
    last = e->Launch();
    if (last.ok()) return e;
    (void)e->Kill();
    std::error_code ec;
    std::filesystem::remove_all(e->dir_ + "/data", ec);
  }
  return last;
}

EtcdServer::~EtcdServer() {
  (void)Kill();
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

Status EtcdServer::Launch() {
  Subprocess::Options so;
  so.quiet_stderr = true;
  so.own_process_group = true;
  const std::vector<std::string> argv = membership::SingleEtcdArgs(
      "experiment", dir_ + "/data", client_port_, peer_port_, log_path_);
  TESSERA_RETURN_IF_ERROR(forker_.Run([&]() -> Status {
    auto p = Subprocess::Start(argv, so);
    if (!p.ok()) return p.status();
    proc_ = std::move(*p);
    return Status::Ok();
  }));
  Status st = membership::WaitForEtcd(endpoint_, 15000, [&] { return proc_.Poll(); });
  if (st.code() == StatusCode::kUnavailable) {
    return Unavailable("etcd exited at start (log: ", log_path_,
                       "): ", ReadWholeFile(log_path_).substr(0, 2000));
  }
  return st;
}

Status EtcdServer::Kill() { return Reap(proc_); }

Status EtcdServer::Stop() {
  if (!proc_.running()) return Unavailable("etcd is not running");
  return proc_.Signal(SIGSTOP);
}

Status EtcdServer::Cont() {
  if (!proc_.running()) return Unavailable("etcd is not running");
  return proc_.Signal(SIGCONT);
}

Status EtcdServer::Restart() {
  TESSERA_RETURN_IF_ERROR(Kill());
  return Launch();
}

// ---- ClientProcess ----

Result<std::unique_ptr<ClientProcess>> ClientProcess::Start(const std::string& bin_dir,
                                                            const std::string& spec_json,
                                                            const std::string& spec_path) {
  TESSERA_RETURN_IF_ERROR(WriteWholeFile(spec_path, spec_json));
  std::unique_ptr<ClientProcess> c(new ClientProcess());
  c->bin_dir_ = bin_dir;
  c->spec_path_ = spec_path;
  TESSERA_RETURN_IF_ERROR(c->Launch(/*wait_loaded=*/true));
  return c;
}

ClientProcess::~ClientProcess() { (void)Reap(proc_); }

Status ClientProcess::Launch(bool wait_loaded) {
  Subprocess::Options so;
  so.capture_stdout = true;
  so.quiet_stderr = true;
  so.own_process_group = true;
  TESSERA_RETURN_IF_ERROR(forker_.Run([&]() -> Status {
    auto p = Subprocess::Start({bin_dir_ + "/tessera-experiment", "client", spec_path_}, so);
    if (!p.ok()) return p.status();
    proc_ = std::move(*p);
    return Status::Ok();
  }));
  loaded_ = false;
  if (!wait_loaded) return Status::Ok();
  auto line = proc_.WaitForLine("client loaded", Deadline::AfterMs(30000));
  if (!line.ok()) return line.status().WithContext("the client process did not write its pages");
  loaded_ = true;
  return Status::Ok();
}

Status ClientProcess::KillAndRestart() {
  TESSERA_RETURN_IF_ERROR(Reap(proc_));
  ++kills_;
  return Launch(/*wait_loaded=*/false);
}

Result<ClientOutcome> ClientProcess::Finish() {
  if (!proc_.running()) return Unavailable("the client process is not running");
  if (!loaded_) {  // Started by the last kill: its SIGTERM handler and pages come first.
    auto loaded = proc_.WaitForLine("client loaded", Deadline::AfterMs(30000));
    if (!loaded.ok()) {
      return loaded.status().WithContext("the final client process did not write its pages");
    }
    loaded_ = true;
  }
  TESSERA_RETURN_IF_ERROR(proc_.Signal(SIGTERM));
  auto line = proc_.WaitForLine("client result", Deadline::AfterMs(60000));
  auto ws = proc_.Wait(Deadline::AfterMs(10000));
  if (!line.ok()) return line.status().WithContext("the final client process did not report");
  if (!ws.ok()) return ws.status().WithContext("the final client process did not exit");
  ClientOutcome o;
  unsigned long long pages, checked, lost, wrong, errors;
  if (std::sscanf(line->c_str(),
                  "client result pages=%llu checked=%llu lost=%llu wrong_bytes=%llu "
                  "read_errors=%llu",
                  &pages, &checked, &lost, &wrong, &errors) != 5) {
    return ProtocolError("client process: cannot parse '", *line, "'");
  }
  o = {pages, checked, lost, wrong, errors};
  return o;
}

// ---- the client process ----

namespace {

std::atomic<bool> g_finish{false};
void OnTerm(int) { g_finish.store(true); }

// Content of version `v` of page `p`.
void Fill(uint64_t seed, uint64_t p, uint32_t v, uint8_t* out) {
  uint64_t s = Mix(seed ^ Mix(p * 0x100000001ull + v));
  for (size_t i = 0; i < client::kPageSize; i += 8) {
    s = Mix(s);
    std::memcpy(out + i, &s, 8);
  }
}

}  // namespace

int RunClientProcess(const std::string& spec_path) {
  struct sigaction sa {};
  sa.sa_handler = OnTerm;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  auto fail = [](const std::string& what) {
    std::fprintf(stderr, "tessera experiment client: %s\n", what.c_str());
    return 1;
  };
  auto j = nlohmann::json::parse(ReadWholeFile(spec_path), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return fail("cannot read the spec " + spec_path);
  client::ErasureCodedStoreOptions eo;
  uint64_t pages = 0, seed = 0;
  try {
    for (const auto& ep : j.at("servers")) {
      auto e = fabric::ParseEndpoint(ep.get<std::string>());
      if (!e.ok()) return fail(e.status().ToString());
      eo.remote.servers.push_back(client::RemoteServer{*e, ""});
    }
    std::string secret = ReadWholeFile(j.at("token_file").get<std::string>());
    while (!secret.empty() && (secret.back() == '\n' || secret.back() == ' ')) secret.pop_back();
    eo.remote.secret = secret;
    pages = j.at("pages").get<uint64_t>();
    seed = j.at("seed").get<uint64_t>();
    eo.remote.capacity_pages = pages;
    eo.remote.op_timeout_ms = j.at("op_timeout_ms").get<uint32_t>();
    eo.remote.heartbeat_timeout_ms = j.at("heartbeat_timeout_ms").get<uint32_t>();
    eo.remote.placement.kind = j.at("placement").get<std::string>() == "random"
                                   ? placement::PolicyKind::kRandom
                                   : placement::PolicyKind::kCodingSets;
    eo.remote.placement.l = j.at("l").get<int>();
    eo.remote.placement.seed = seed;
    eo.k = j.at("k").get<int>();
    eo.r = j.at("r").get<int>();
    eo.delta = j.at("delta").get<int>();
    auto layout = client::ParseEcLayout(j.at("layout").get<std::string>());
    if (!layout.ok()) return fail(layout.status().ToString());
    eo.layout = *layout;
  } catch (const std::exception& e) {
    return fail(std::string("bad spec: ") + e.what());
  }
  // Every process is a new owner on the memservers (client id 0: a random one per process).
  auto store = client::CreateErasureCodedStore(eo);
  if (!store.ok()) return fail(store.status().ToString());
  constexpr size_t kBatch = 32;
  std::vector<uint32_t> version(pages, 1);
  std::vector<uint8_t> unknown(pages, 0);  // A failed write may or may not have landed.
  std::vector<uint8_t> buf(kBatch * client::kPageSize), want(client::kPageSize);
  std::vector<client::PageId> ids(kBatch);
  for (uint64_t p = 0; p < pages; p += kBatch) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kBatch, pages - p));
    for (size_t i = 0; i < n; ++i) {
      ids[i] = p + i;
      Fill(seed, p + i, 1, buf.data() + i * client::kPageSize);
    }
    Status st = (*store)->WritePages(ids.data(), n, buf.data());
    if (!st.ok()) return fail("writing the pages: " + st.ToString());
  }
  std::printf("client loaded %llu pages\n", static_cast<unsigned long long>(pages));
  std::fflush(stdout);
  ClientOutcome out;
  out.pages = pages;
  auto check = [&](client::PageId p, const Status& st, const uint8_t* got) {
    if (st.code() == StatusCode::kDataLoss) {
      ++out.lost;
      return;
    }
    if (!st.ok()) {
      ++out.read_errors;
      return;
    }
    if (unknown[p]) return;
    Fill(seed, p, version[p], want.data());
    for (size_t i = 0; i < client::kPageSize; ++i) out.wrong_bytes += want[i] != got[i];
    ++out.checked;
  };
  // Until SIGTERM: rewrite one random page and read another back, checking it.
  std::mt19937_64 rng(seed ^ static_cast<uint64_t>(::getpid()));
  std::uniform_int_distribution<uint64_t> pick(0, pages - 1);
  while (!g_finish.load()) {
    const client::PageId w = pick(rng);
    Fill(seed, w, version[w] + 1, buf.data());
    ++version[w];
    unknown[w] = !(*store)->WritePage(w, buf.data()).ok();
    const client::PageId r = pick(rng);
    check(r, (*store)->ReadPage(r, buf.data()), buf.data());
  }
  // The final pass: every page read back and checked.
  out.checked = 0;
  out.lost = out.wrong_bytes = out.read_errors = 0;
  for (client::PageId p = 0; p < pages; ++p) check(p, (*store)->ReadPage(p, buf.data()), buf.data());
  store->reset();  // Frees its slabs on every memserver.
  std::printf("client result pages=%llu checked=%llu lost=%llu wrong_bytes=%llu read_errors=%llu\n",
              static_cast<unsigned long long>(out.pages),
              static_cast<unsigned long long>(out.checked),
              static_cast<unsigned long long>(out.lost),
              static_cast<unsigned long long>(out.wrong_bytes),
              static_cast<unsigned long long>(out.read_errors));
  std::fflush(stdout);
  return 0;
}

}  // namespace tessera::experiment
