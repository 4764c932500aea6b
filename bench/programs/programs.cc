#include "bench/programs/programs.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "common/clock.h"
#include "common/subprocess.h"
#include "fabric/connect.h"

namespace tessera::bench::programs {
namespace {

const char kPython[] = "/usr/bin/python3";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int TimeoutS(const Env* env, const Mode& m) {
  return m.timeout_s > 0 ? m.timeout_s : env->timeout_s;
}

// The command line that starts `argv` under mode `m`.
std::vector<std::string> Wrap(Env* env, const Mode& m, const std::vector<std::string>& argv) {
  std::vector<std::string> out;
  if (m.kind == Mode::kTessera) {
    out = {env->bin + "/tessera-run",
           "--cluster",
           env->cluster->cluster_file_path(),
           "--auth_token_file",
           env->cluster->token_path(),
           "--local_memory",
           Pct(m.fraction),
           "--k",
           std::to_string(env->k),
           "--r",
           std::to_string(env->r),
           "--summary=false",
           "--progress=false",
           "--compressed_tier",
           m.tier,
           "--stats_json",
           env->tmp + "/stats-" + std::to_string(++env->seq) + ".json"};
    if (env->run_has_layout) out.insert(out.end(), {"--layout", m.layout});
    out.push_back("--");
  } else if (m.kind == Mode::kSwap) {
    // A shell moves itself into the cgroup, then execs the program (and its children stay in).
    std::string cmd = "echo $$ > " + m.cgroup + "/cgroup.procs && exec";
    for (const auto& a : argv) cmd += " '" + a + "'";
    return {"/bin/sh", "-c", cmd};
  }
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

// The program's peak RSS so far (VmHWM), 0 if it is gone.
uint64_t PeakRss(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) << 10;
  }
  return 0;
}

// Waits for `p` (bounded), sampling its peak RSS; fills ok/oom/error from its exit.
void WaitProgram(Env* env, Subprocess* p, const Mode& m, Outcome* o) {
  const int timeout_s = TimeoutS(env, m);
  const Deadline deadline = Deadline::AfterMs(static_cast<uint64_t>(timeout_s) * 1000);
  while (!p->Poll()) {
    o->peak_rss = std::max(o->peak_rss, PeakRss(p->pid()));
    const bool stop = env->stop != nullptr && *env->stop;
    if (deadline.Expired() || stop) {
      (void)p->Signal(SIGKILL);
      (void)p->Wait(Deadline::AfterMs(30000));
      o->timeout = !stop;
      o->error = stop ? std::string("interrupted")
                      : "did not finish within " + std::to_string(timeout_s) + " s";
      return;
    }
    usleep(20000);  // Sampling VmHWM and polling the exit; not synchronisation.
  }
  const int ws = *p->exit_status();
  if (WIFSIGNALED(ws)) {
    o->oom = m.kind == Mode::kSwap && WTERMSIG(ws) == SIGKILL;
    o->error = std::string("killed by signal ") + std::to_string(WTERMSIG(ws)) +
               (o->oom ? " (the OOM killer: the limit is too small for swap to complete)" : "");
    return;
  }
  if (WEXITSTATUS(ws) != 0) {
    o->error = "exit status " + std::to_string(WEXITSTATUS(ws));
    return;
  }
  o->ok = true;
}

// Starts `argv` under `m` and waits for it (bounded); the process, for its output, or null
// when it could not start (o->error says why).
std::optional<Subprocess> StartAndWait(Env* env, const Mode& m,
                                       const std::vector<std::string>& argv,
                                       std::vector<std::string> extra_env, Outcome* o) {
  const uint64_t t0 = MonotonicNs();
  auto p = Subprocess::Start(Wrap(env, m, argv), Subprocess::Options{true, true, extra_env});
  if (!p.ok()) {
    o->error = p.status().ToString();
    return std::nullopt;
  }
  WaitProgram(env, &*p, m, o);
  o->secs = (MonotonicNs() - t0) / 1e9;
  return std::move(*p);
}

// Runs `argv` under `m`; its identity is the lines of its stdout that start with `prefix`.
// (Its few output lines wait in the pipe while the exit is polled and its RSS sampled.)
Outcome RunForDigest(Env* env, const Mode& m, const std::vector<std::string>& argv,
                     const std::string& prefix, std::vector<std::string> extra_env = {}) {
  Outcome o;
  auto p = StartAndWait(env, m, argv, std::move(extra_env), &o);
  if (!p) return o;
  for (;;) {
    auto line = p->ReadLine(Deadline::AfterMs(10000));
    if (!line.ok()) break;
    if (line->rfind(prefix, 0) == 0) o.identity += *line + "\n";
  }
  if (o.ok && o.identity.empty()) {
    o.ok = false;
    o.error = "no '" + prefix + "' line in its output";
  }
  return o;
}

// Runs `argv` under `m`; it writes `out`, whose bytes are its identity (the file is removed).
Outcome RunForFile(Env* env, const Mode& m, const std::vector<std::string>& argv,
                   const std::string& out, std::vector<std::string> extra_env = {}) {
  Outcome o;
  if (!StartAndWait(env, m, argv, std::move(extra_env), &o)) return o;
  o.identity = ReadAll(out);
  ::unlink(out.c_str());
  if (o.ok && o.identity.empty()) {
    o.ok = false;
    o.error = "no output";
  }
  return o;
}

std::string OutPath(Env* env, const char* what) {
  return env->tmp + "/" + what + "-out-" + std::to_string(++env->seq);
}

// xorshift64: the generated inputs are the same in every run and on every machine.
struct XorShift {
  uint64_t x = 88172645463325252ull;
  uint64_t Next() {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  }
};

Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  f.close();
  return f ? Status::Ok() : Internal("cannot write " + path);
}

// --- the python3 workload -------------------------------------------------------------------

Outcome RunWorkload(Env* env, const Mode& m) {
  return RunForDigest(env, m,
                      {kPython, env->scripts_dir + "/workload.py",
                       std::to_string(env->sizes.workload_records), "16", "1"},
                      "tessera-workload: records");
}

// --- GNU sort ---------------------------------------------------------------------------------

std::string SortInput(const Env* env) { return env->tmp + "/sort-input"; }

Status PrepareSort(Env* env) {
  XorShift g;
  std::string text;
  for (int i = 0; i < env->sizes.sort_lines; ++i) {
    const uint64_t x = g.Next();
    char line[128];
    std::snprintf(line, sizeof line, "%016llx %d the quick brown fox %llu\n",
                  static_cast<unsigned long long>(x), i,
                  static_cast<unsigned long long>(x % 100000));
    text += line;
  }
  return WriteFile(SortInput(env), text);
}

Outcome RunSort(Env* env, const Mode& m) {
  const std::string out = OutPath(env, "sort");
  return RunForFile(env, m, {"/usr/bin/sort", "-S", "1G", SortInput(env), "-o", out}, out,
                    {"LC_ALL=C"});
}

// --- redis under redis-benchmark --------------------------------------------------------------

// redis-server loaded by kv_loader.py, then redis-benchmark; the time is load + benchmark.
// Identity: the loader's read-back digest and redis DEBUG DIGEST.
Outcome RunRedis(Env* env, const Mode& m) {
  Outcome o;
  auto picked = fabric::PickListenPort();
  if (!picked.ok()) {
    o.error = picked.status().ToString();
    return o;
  }
  const int port = *picked;
  auto argv = Wrap(env, m,
                   {"/usr/bin/redis-server", "--port", std::to_string(port), "--bind", "127.0.0.1",
                    "--save", "", "--appendonly", "no", "--enable-debug-command", "local"});
  auto server = Subprocess::Start(argv, Subprocess::Options{true, true, {}});
  if (!server.ok()) {
    o.error = server.status().ToString();
    return o;
  }
  const Deadline ready_by = Deadline::AfterMs(120000);
  for (;;) {
    auto line = server->ReadLine(ready_by);
    if (!line.ok()) {
      o.error = "redis-server never became ready: " + line.status().ToString();
      return o;
    }
    if (line->find("Ready to accept connections") != std::string::npos) break;
  }
  const uint64_t t0 = MonotonicNs();
  auto run = [&](const std::vector<std::string>& a, std::string* out) -> bool {
    auto p = Subprocess::Start(a, Subprocess::Options{true, true, {}});
    if (!p.ok()) return false;
    std::string all;
    for (;;) {
      auto line = p->ReadLine(Deadline::AfterMs(static_cast<uint64_t>(TimeoutS(env, m)) * 1000));
      if (!line.ok()) break;
      all += *line + "\n";
      o.peak_rss = std::max(o.peak_rss, PeakRss(server->pid()));
    }
    auto ws = p->Wait(Deadline::AfterMs(60000));
    if (out) *out = all;
    return ws.ok() && WIFEXITED(*ws) && WEXITSTATUS(*ws) == 0;
  };
  const std::string port_s = std::to_string(port);
  std::string loaded, bench, digest;
  bool good = run({kPython, env->scripts_dir + "/kv_loader.py", "redis", port_s,
                   std::to_string(env->sizes.redis_keys), "200"},
                  &loaded) &&
              run({"/usr/bin/redis-benchmark", "-p", port_s, "-q", "-n",
                   std::to_string(env->sizes.redis_requests), "-d", "200", "-t",
                   "set,get,lpush,lrange_100"},
                  &bench);
  o.secs = (MonotonicNs() - t0) / 1e9;
  o.peak_rss = std::max(o.peak_rss, PeakRss(server->pid()));
  good = good && run({"/usr/bin/redis-cli", "-p", port_s, "DEBUG", "DIGEST"}, &digest);
  (void)run({"/usr/bin/redis-cli", "-p", port_s, "SHUTDOWN", "NOSAVE"}, nullptr);
  WaitProgram(env, &*server, m, &o);
  if (!good && o.error.empty()) o.error = "loader, redis-benchmark or DEBUG DIGEST failed";
  o.ok = o.ok && good;
  size_t v = loaded.find("kv-loader: verified");
  o.identity = (v == std::string::npos ? std::string() : loaded.substr(v)) + digest;
  return o;
}

// --- an in-memory database building an index ----------------------------------------------

std::string SqliteScript(const Env* env) { return env->tmp + "/sqlite-index.sql"; }

// SQLite on an in-memory database: a table of N rows with pseudo-random keys, an index on the
// keys, then a digest of the rows in index order (the window sum checks the order itself).
Status PrepareSqlite(Env* env) {
  const std::string n = std::to_string(env->sizes.sqlite_rows);
  return WriteFile(
      SqliteScript(env),
      "PRAGMA cache_size=-4000000;\n"
      "CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT, v TEXT);\n"
      "WITH RECURSIVE c(i, x) AS (SELECT 1, 12345 UNION ALL\n"
      "  SELECT i + 1, (x * 1103515245 + 12345) % 2147483648 FROM c WHERE i < " +
          n +
          ")\n"
          "INSERT INTO t SELECT i, printf('%08x-%d', x, i % 977), printf('%.*c', 100 + i % 80, 'v')"
          " FROM c;\n"
          "CREATE INDEX tk ON t(k);\n"
          "SELECT 'tessera-sqlite rows', count(*), sum(length(v)), min(k), max(k) FROM t;\n"
          "SELECT 'tessera-sqlite order', sum(rn * id % 1000003) FROM\n"
          "  (SELECT id, row_number() OVER (ORDER BY k) AS rn FROM t);\n");
}

Outcome RunSqlite(Env* env, const Mode& m) {
  return RunForDigest(env, m, {"/usr/bin/sqlite3", ":memory:", ".read " + SqliteScript(env)},
                      "tessera-sqlite");
}

// --- a script interpreter with a large hash table -------------------------------------------

Outcome RunHashtable(Env* env, const Mode& m) {
  return RunForDigest(
      env, m,
      {kPython, env->scripts_dir + "/hashtable.py", std::to_string(env->sizes.hashtable_keys)},
      "tessera-hashtable:");
}

// --- a compressor with a large window and large match tables --------------------------------

std::string CompressInput(const Env* env) { return env->tmp + "/compress-input"; }

// Text of random words: an 8 MiB block, repeated with a few changed bytes per copy, so that the
// long-range window finds the repeats and the match tables are walked at random.
Status PrepareCompress(Env* env) {
  XorShift g;
  std::vector<std::string> words(5000);
  for (auto& w : words) {
    const int len = 3 + static_cast<int>(g.Next() % 8);
    for (int i = 0; i < len; ++i) w += static_cast<char>('a' + g.Next() % 26);
  }
  std::string block;
  while (block.size() < (8u << 20)) block += words[g.Next() % words.size()] + ' ';
  block.resize(8u << 20);
  std::ofstream f(CompressInput(env), std::ios::binary);
  const uint64_t total = static_cast<uint64_t>(env->sizes.compress_mb) << 20;
  for (uint64_t done = 0; done < total;) {
    std::string copy = block;
    for (int i = 0; i < 2000; ++i) copy[g.Next() % copy.size()] = static_cast<char>('A' + i % 26);
    const size_t n = static_cast<size_t>(std::min<uint64_t>(copy.size(), total - done));
    f.write(copy.data(), static_cast<std::streamsize>(n));
    done += n;
  }
  f.close();
  return f ? Status::Ok() : Internal("cannot write " + CompressInput(env));
}

Outcome RunCompress(Env* env, const Mode& m) {
  const std::string out = OutPath(env, "compress");
  return RunForFile(env, m,
                    {"/usr/bin/zstd", "-q", "-f", "-T1", "-3", "--long=28",
                     "--zstd=wlog=28,hlog=25,clog=25", CompressInput(env), "-o", out},
                    out);
}

// --- a managed runtime: node building a large Map --------------------------------------------

Outcome RunNode(Env* env, const Mode& m) {
  return RunForDigest(env, m,
                      {"/usr/bin/node", env->scripts_dir + "/map_workload.js",
                       std::to_string(env->sizes.node_entries)},
                      "map-workload:");
}

}  // namespace

const std::vector<Program>& All() {
  static const std::vector<Program> kAll = {
      {"workload",
       "the demo's python3 workload (an in-memory external sort of records)",
       {kPython},
       {"workload.py"},
       2.0,
       nullptr,
       RunWorkload},
      {"sort",
       "GNU sort -S 1G of a generated file",
       {"/usr/bin/sort"},
       {},
       10.0,
       PrepareSort,
       RunSort},
      {"redis",
       "redis-server loaded by kv_loader.py, then redis-benchmark",
       {kPython, "/usr/bin/redis-server", "/usr/bin/redis-benchmark", "/usr/bin/redis-cli"},
       {"kv_loader.py"},
       3.0,
       nullptr,
       RunRedis},
      {"sqlite",
       "SQLite building an index on an in-memory table",
       {"/usr/bin/sqlite3"},
       {},
       0,
       PrepareSqlite,
       RunSqlite},
      {"hashtable",
       "a python3 dict of string keys, then random lookups",
       {kPython},
       {"hashtable.py"},
       0,
       nullptr,
       RunHashtable},
      {"compress",
       "zstd with a 256 MiB window and large match tables",
       {"/usr/bin/zstd"},
       {},
       0,
       PrepareCompress,
       RunCompress},
      {"node",
       "node (V8) building a Map of small objects",
       {"/usr/bin/node"},
       {"map_workload.js"},
       0,
       nullptr,
       RunNode},
  };
  return kAll;
}

const Program* Find(std::string_view name) {
  for (const Program& p : All()) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

std::string Names() {
  std::string out;
  for (const Program& p : All()) out += (out.empty() ? "" : ", ") + std::string(p.name);
  return out;
}

std::string Pct(double f) { return std::to_string(static_cast<int>(f * 100 + 0.5)) + "%"; }

nlohmann::json TakeRunStats(Env* env, const Mode& m) {
  if (m.kind != Mode::kTessera) return nullptr;
  const std::string path = env->tmp + "/stats-" + std::to_string(env->seq) + ".json";
  auto j = nlohmann::json::parse(ReadAll(path), nullptr, /*allow_exceptions=*/false);
  ::unlink(path.c_str());
  return j.is_discarded() ? nlohmann::json(nullptr) : j;
}

}  // namespace tessera::bench::programs
