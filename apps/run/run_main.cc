// `tessera run`: runs an unmodified program with its heap paged to remote memory.
//
// Starts (or connects to) the memservers, then runs PROGRAM with LD_PRELOAD=
// libtessera_preload.so (kernel_shim/preload) and the TESSERA_RUN_* variables that tell the
// shim where the servers are, the code (k, r), the local-memory limit and where to write its
// stats. Waits for the program, shows live progress on a terminal, prints a summary at exit
// (and --stats_json), and exits with the program's exit code (128 + signal for a signal death,
// like a shell; 127 when PROGRAM is not found, 126 when it cannot be executed; 2 for usage
// errors; 1 when paging cannot be set up).
#include <dirent.h>
#include <elf.h>
#include <fcntl.h>
#include <gflags/gflags.h>
#include <linux/userfaultfd.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/cli/cli.h"
#include "apps/cli/membership_cli.h"
#include "apps/cli/store_flags.h"
#include "apps/cli/store_metrics.h"
#include "apps/run/exit_status.h"
#include "apps/run/run_metrics.h"
#include "apps/run/swap_pager.h"
#include "client/local_cluster.h"
#include "client/remote_store.h"
#include "common/clock.h"
#include "common/file.h"
#include "common/logging.h"
#include "common/subprocess.h"
#include "common/units.h"
#include "kernel_shim/preload/run_stats.h"
#include "membership/etcd_view.h"

DEFINE_string(local_memory, "50%",
              "Local memory for the program's paged heap: P% of its peak footprint, or a fixed "
              "size (e.g. 256M, 2G); 100% = no limit");
DEFINE_string(region, "8G", "Size of the paged region (virtual; bounds the paged heap)");
DEFINE_string(stats_json, "", "Write the summary as JSON to this file");
DEFINE_string(live_stats_file, "",
              "The pager rewrites this file with `key value` stats twice a second (for tools "
              "and tests; default: a private temporary file, or none with --pager swap)");
DEFINE_bool(progress, true, "Live progress on stderr when it is a terminal");
DEFINE_bool(summary, true, "Print the summary to stderr at exit");
DEFINE_bool(write_traps, true,
            "The victim policy write-protects resident dirty pages as they come round to learn "
            "whether they are written again (--nowrite_traps: only first writes and re-faults "
            "inform it; fewer write-protect ioctls and faults). Not given: on only when the "
            "inactive list is off or unavailable (the list sees reads and writes of victims)");
DEFINE_bool(inactive_list, true,
            "Evicted pages first wait on an inactive list, still local (moved out of the "
            "program's mapping, counted against --local-memory); an access to one - a read too - "
            "moves it back without a store read, and only pages that reach the list's end "
            "untouched are written back. --noinactive_list writes victims back at once");
DEFINE_bool(direct_reads, true,
            "Group layout: a fault thread reads a remote page itself, over its own connection to "
            "the server holding it (run to completion); --nodirect_reads hands every read to the "
            "page store's I/O thread and back (slower; for comparison)");
DEFINE_bool(batch_faults, true,
            "A fault thread that wakes to several queued faults (program threads faulting at "
            "once) posts their page reads together and maps them itself; --nobatch-faults hands "
            "all but one to the page store's I/O thread one by one (for comparison)");
DEFINE_int32(fault_spin_us, 0,
             "Microseconds (0..1000) a fault thread polls the userfaultfd after serving a fault "
             "before it sleeps (one fault thread polls at a time): a fault that comes within it "
             "skips a thread wake-up, at the price of a CPU that the program's other threads, "
             "the evictor and local memservers would use. 0 (the default) sleeps at once: on 2 "
             "CPUs shared with the memservers, polling for 30 us made the python workload and "
             "GNU sort 10-15% slower (docs/guides/run.md)");
DEFINE_int32(direct_spin_us, -1,
             "The most microseconds (0..1000) a direct read polls for the server's reply "
             "(twice the recent reply time, within this bound) before it sleeps "
             "(RemoteStoreOptions::direct_spin_us); 0 never polls; -1: the store's default");
DEFINE_string(compressed_tier, "off",
              "--pager uffd: a compressed local tier in front of the memservers: evicted pages "
              "are LZ4-compressed into local memory (counted against --local-memory at their "
              "compressed size) and written back in the background; a fault on one decompresses "
              "it, no network. off, auto (up to a quarter of the local budget) or a size (e.g. "
              "64M); it shrinks itself, to 1/16, while its hits are pages the resident set would "
              "have kept with its room");
DEFINE_string(pager, "uffd",
              "uffd: page the program's heap in-process with userfaultfd (no root needed); swap: "
              "run it and its children in a cgroup-v1 memory limit with a private `tessera swap` "
              "kernel swap device (root; every page of every process, any runtime)");
DEFINE_string(swap_size, "", "--pager swap: size of the private swap device (default: --region)");
DEFINE_double(term_grace, 10,
              "Seconds the program has to exit after tessera run forwards it SIGTERM or SIGHUP "
              "(e.g. from `timeout`); then it gets SIGKILL. The memservers stop only after the "
              "program is gone, so its shutdown handlers can still read its paged heap");

namespace tessera {
namespace {

const cli::CliSpec kSpec = {
    "tessera run",
    "[--pager uffd|swap] [--local-memory 50%|BYTES] [--compressed-tier off|auto|SIZE] "
    "[--cluster FILE | --etcd ENDPOINTS --cluster-name NAME] [--auth-token-file F] [--k 4 --r 2] "
    "[--stats-json FILE] [--term-grace 10] -- PROGRAM [ARGS...]",
    "Runs PROGRAM with its anonymous memory (malloc, private anonymous mmap, runtime heap\n"
    "reservations) in memory paged by userfaultfd: only --local-memory of it stays local, the\n"
    "rest is erasure-coded RS(k,r) across memservers (an embedded local cluster of k+2r\n"
    "servers unless --cluster or --etcd is given; with --etcd, servers that join or leave\n"
    "while it runs are followed), so the program survives the loss of r servers. Programs it\n"
    "and its descendants exec are paged too (one --local-memory budget per process); a fork\n"
    "without exec gets a full private copy of the heap. Shared, file and mlocked mappings are\n"
    "left out and counted; a statically linked PROGRAM runs unpaged with a warning. Prints a\n"
    "summary at exit and\n"
    "exits with the program's exit code (128+N for a death by signal N, 127 if PROGRAM is not\n"
    "found).",
    __FILE__,
    1,
    -1,
    // No --io-threads: the paged program's store runs in the preload library, which takes
    // its settings from the environment tessera run sets, and that has no I/O thread count.
    cli::StoreFlagNames(cli::kCodeFlags | cli::kEmbeddedFlags | cli::kMetricsFlags |
                        cli::kClusterFlags)};

// `tessera run --etcd`: mirrors a MembershipView into a cluster file (one `HOST:PORT [rack=R]`
// line per registered server, `# server_id` comments so a restarted server changes the file),
// rewritten atomically (write + rename) on every change; the shim follows the file. Listener
// calls come from the view's watch thread.
class MembersFile {
 public:
  static Result<std::unique_ptr<MembersFile>> Start(std::string path,
                                                    membership::MembershipView* view) {
    std::unique_ptr<MembersFile> f(new MembersFile());
    f->path_ = std::move(path);
    f->view_ = view;
    {
      std::lock_guard<std::mutex> lock(f->mu_);
      for (const auto& m : view->Members()) f->members_[m.server_id] = m;
      TESSERA_RETURN_IF_ERROR(f->WriteLocked());
    }
    MembersFile* self = f.get();
    f->listener_ = view->Subscribe([self](const membership::MembershipChange& c) {
      std::lock_guard<std::mutex> lock(self->mu_);
      if (c.kind == membership::MembershipChange::Kind::kJoined) {
        self->members_[c.server.server_id] = c.server;
      } else {
        self->members_.erase(c.server.server_id);
      }
      Status st = self->WriteLocked();
      if (!st.ok()) TLOG(WARNING) << "tessera run: membership file: " << st;
    });
    return f;
  }
  ~MembersFile() { view_->Unsubscribe(listener_); }

 private:
  MembersFile() = default;
  Status WriteLocked() {
    std::string text = "# written by tessera run from etcd\n";
    for (const auto& [id, m] : members_) {
      text += m.endpoint + (m.rack.empty() ? "" : " rack=" + m.rack) + "  # " + id + "\n";
    }
    const std::string tmp = path_ + ".tmp";
    FILE* out = std::fopen(tmp.c_str(), "w");
    if (out == nullptr) return ErrnoError("open ", tmp);
    const bool ok = std::fwrite(text.data(), 1, text.size(), out) == text.size();
    if (std::fclose(out) != 0 || !ok) return ErrnoError("write ", tmp);
    if (std::rename(tmp.c_str(), path_.c_str()) != 0) return ErrnoError("rename ", tmp);
    return Status::Ok();
  }
  std::string path_;
  membership::MembershipView* view_ = nullptr;
  uint64_t listener_ = 0;
  std::mutex mu_;
  std::map<std::string, membership::ServerRecord> members_;  // By server_id; under mu_.
};

pid_t g_child = -1;
// Set when a termination request (SIGTERM, SIGHUP) arrived: the program then has --term_grace
// seconds to exit before it gets SIGKILL.
volatile sig_atomic_t g_term_requested = 0;

void ForwardSignal(int sig, siginfo_t* info, void*) {
  if (sig == SIGTERM || sig == SIGHUP) g_term_requested = 1;
  // Signals from the terminal (^C, ^\) already reach the program (same process group). The
  // embedded memservers are in process groups of their own, so they are not stopped before
  // the program (see LocalClusterOptions::own_process_group).
  if (info != nullptr && info->si_code == SI_KERNEL) return;
  if (g_child > 0) kill(g_child, sig);
}

// PROGRAM resolved like a shell: a name without '/' is searched in PATH.
Result<std::string> ResolveProgram(const std::string& name, int* exit_code) {
  auto check = [&](const std::string& path) -> int {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return 127;
    if (S_ISDIR(st.st_mode) || access(path.c_str(), X_OK) != 0) return 126;
    return 0;
  };
  if (name.find('/') != std::string::npos) {
    int rc = check(name);
    if (rc == 0) return name;
    *exit_code = rc;
    return rc == 127 ? NotFound(name + ": no such file")
                     : InvalidArgument(name + ": not an executable file");
  }
  const char* path_env = getenv("PATH");
  std::string path = path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
  int best = 127;
  size_t i = 0;
  while (i <= path.size()) {
    size_t j = path.find(':', i);
    if (j == std::string::npos) j = path.size();
    std::string dir = path.substr(i, j - i);
    if (dir.empty()) dir = ".";
    std::string cand = dir + "/" + name;
    int rc = check(cand);
    if (rc == 0) return cand;
    if (rc == 126) best = 126;
    i = j + 1;
  }
  *exit_code = best;
  return best == 127 ? NotFound(name + ": command not found")
                     : InvalidArgument(name + ": not an executable file");
}

// Whether this process may create a userfaultfd (the syscall, or /dev/userfaultfd).
Status ProbeUserfaultfd() {
  long fd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
  if (fd >= 0) {
    close(static_cast<int>(fd));
    return Status::Ok();
  }
  const int sys_errno = errno;
  int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
  if (dev >= 0) {
    int ufd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
    close(dev);
    if (ufd >= 0) {
      close(ufd);
      return Status::Ok();
    }
  }
  const int dev_errno = errno;
  return Unavailable(std::string("userfaultfd is not available on this machine (userfaultfd(2): ") +
                     strerror(sys_errno) + "; /dev/userfaultfd: " + strerror(dev_errno) +
                     "). Allow it with `sysctl vm.unprivileged_userfaultfd=1`, or give this user "
                     "read/write access to /dev/userfaultfd, or run as root");
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Mb(uint64_t pages) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f MB", pages * 4096.0 / 1e6);
  return b;
}
std::string Us(uint64_t ns) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f us", ns / 1e3);
  return b;
}

uint64_t Get(const kernel_shim::RunStats& s, const char* key) {
  auto it = s.find(key);
  return it == s.end() ? 0 : it->second;
}

void PrintProgress(const kernel_shim::RunStats& s, double secs) {
  std::fprintf(stderr,
               "\r\033[K[tessera run %.0fs] faults %llu  remote r/w %llu/%llu  evictions %llu  "
               "resident %s / limit %s",
               secs, static_cast<unsigned long long>(Get(s, "faults")),
               static_cast<unsigned long long>(Get(s, "remote_reads")),
               static_cast<unsigned long long>(Get(s, "remote_writes")),
               static_cast<unsigned long long>(Get(s, "evictions")),
               Mb(Get(s, "resident_pages")).c_str(),
               Get(s, "limit_pages") ? Mb(Get(s, "limit_pages")).c_str() : "none");
  std::fflush(stderr);
}

// Whether `path` is an ELF executable without a program interpreter (statically linked):
// LD_PRELOAD cannot reach it.
bool StaticallyLinked(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  Elf64_Ehdr eh;
  if (!in.read(reinterpret_cast<char*>(&eh), sizeof(eh))) return false;
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64) {
    return false;  // A script (its interpreter is what runs) or not ELF.
  }
  for (int i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    in.seekg(static_cast<std::streamoff>(eh.e_phoff + static_cast<uint64_t>(i) * eh.e_phentsize));
    if (!in.read(reinterpret_cast<char*>(&ph), sizeof(ph))) return false;
    if (ph.p_type == PT_INTERP) return false;
  }
  return true;
}

// The final stats of every process of the tree (`stats` of the first program, `stats.<pid>`
// of those it started), merged; `error` gets the first program's shim error, if any.
kernel_shim::RunStats TreeStats(const std::string& dir, const std::string& stats_path,
                                std::string* error, bool* have_root) {
  std::vector<kernel_shim::RunStats> each;
  kernel_shim::RunStats root = kernel_shim::ParseRunStats(ReadFile(stats_path), error);
  *have_root = !root.empty();
  if (*have_root) each.push_back(root);
  if (DIR* d = opendir(dir.c_str())) {
    while (struct dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind("stats.", 0) != 0 || name.find(".tmp") != std::string::npos) continue;
      kernel_shim::RunStats s = kernel_shim::ParseRunStats(ReadFile(dir + "/" + name));
      if (!s.empty()) each.push_back(s);
    }
    closedir(d);
  }
  if (each.empty()) return {};
  return kernel_shim::MergeRunStats(each);
}

// "12.0 MB of shared mappings, 3.1 MB of mlocked memory" (peaks), or "" when nothing.
std::string NotPagedText(const kernel_shim::RunStats& s) {
  static const struct {
    const char* key;
    const char* what;
  } kKinds[] = {
      {"not_paged_shared_peak_bytes", "shared mappings"},
      {"not_paged_file_peak_bytes", "writable file mappings"},
      {"not_paged_locked_peak_bytes", "mlocked memory"},
      {"not_paged_stack_peak_bytes", "stack mappings"},
      {"not_paged_hugetlb_peak_bytes", "huge-page mappings"},
      {"not_paged_outside_peak_bytes", "anonymous mappings placed outside the paged region"},
      {"not_paged_region_full_peak_bytes", "mappings made when the paged region was full"}};
  std::string out;
  for (const auto& k : kKinds) {
    const uint64_t b = Get(s, k.key);
    if (b == 0) continue;
    char buf[160];
    if (b < 100000) {
      std::snprintf(buf, sizeof(buf), "%s%.0f KB of %s", out.empty() ? "" : ", ", b / 1e3, k.what);
    } else {
      std::snprintf(buf, sizeof(buf), "%s%.1f MB of %s", out.empty() ? "" : ", ", b / 1e6, k.what);
    }
    out += buf;
  }
  return out;
}

int Main(int argc, char** argv) {
  // Accept --local-memory as well as --local_memory (flags only, up to "--").
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") break;
    if (a.rfind("--", 0) != 0) continue;
    size_t eq = a.find('=');
    std::string name = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    for (char& c : name) if (c == '-') c = '_';
    std::string fixed = "--" + name + (eq == std::string::npos ? "" : a.substr(eq));
    argv[i] = strdup(fixed.c_str());
  }
  cli::InitCli(kSpec, &argc, &argv);
  const cli::StoreFlags sf = cli::ReadStoreFlags(kSpec);
  const cli::ClusterFlags cf = cli::ReadClusterFlags(kSpec);
  if (FLAGS_fault_spin_us < 0 || FLAGS_fault_spin_us > 1000) {
    cli::UsageError(kSpec, "--fault_spin_us must be in 0..1000");
  }
  if (FLAGS_direct_spin_us < -1 || FLAGS_direct_spin_us > 1000) {
    cli::UsageError(kSpec, "--direct_spin_us must be in 0..1000 (or -1: the default)");
  }
  const std::string layout_name(
      client::EcLayoutName(sf.layout.value_or(client::ErasureCodedStoreOptions{}.layout)));
  if (!(FLAGS_term_grace >= 0 && FLAGS_term_grace <= 3600)) {
    cli::UsageError(kSpec, "--term-grace must be in [0, 3600] seconds");
  }
  auto local = kernel_shim::ParseLocalMemory(FLAGS_local_memory);
  if (!local.ok()) cli::UsageError(kSpec, "--local-memory: " + local.status().message());
  auto tier = kernel_shim::ParseCompressedTier(FLAGS_compressed_tier);
  if (!tier.ok()) cli::UsageError(kSpec, "--compressed-tier: " + tier.status().message());
  if (tier->capacity_bytes > 0 && local->bytes > 0 && tier->capacity_bytes >= local->bytes) {
    cli::UsageError(kSpec, "--compressed-tier " + FLAGS_compressed_tier +
                               " must be smaller than --local-memory " + FLAGS_local_memory +
                               " (the tier counts against it)");
  }
  if (tier->enabled && FLAGS_pager == "swap") {
    cli::UsageError(kSpec, "--compressed-tier is for --pager uffd (the kernel's swap has zram)");
  }
  if (sf.metrics_port >= 0 && FLAGS_pager == "swap") {
    cli::UsageError(kSpec,
                    "--metrics-port is for --pager uffd (with --pager swap, `tessera swap`'s own "
                    "metrics are the device's)");
  }
  auto region = ParseSize(FLAGS_region);
  if (!region.ok() || *region < (64ull << 20) || *region % 4096 != 0 || *region > (1ull << 40)) {
    cli::UsageError(kSpec, "--region must be a size in [64M, 1T], a multiple of 4K");
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  int not_found_code = 127;
  auto program = ResolveProgram(args[0], &not_found_code);
  if (!program.ok()) {
    std::fprintf(stderr, "tessera run: %s\n", program.status().message().c_str());
    return not_found_code;
  }
  if (FLAGS_pager != "uffd" && FLAGS_pager != "swap") {
    cli::UsageError(kSpec, "--pager must be uffd or swap");
  }
  if (FLAGS_pager == "swap") {
    run::SwapPagerOptions so;
    so.bin_dir = SelfExeDir();
    so.argv = args;
    so.argv[0] = *program;
    so.fraction = local->fraction < 1 ? local->fraction : 0;
    so.fixed_bytes = local->bytes;
    auto swap_size = ParseSize(FLAGS_swap_size.empty() ? FLAGS_region : FLAGS_swap_size);
    if (!swap_size.ok() || *swap_size % 4096 != 0) cli::UsageError(kSpec, "bad --swap-size");
    so.swap_bytes = *swap_size;
    so.local_memory_text = FLAGS_local_memory;
    so.stats_json = FLAGS_stats_json;
    so.live_stats_file = FLAGS_live_stats_file;
    so.summary = FLAGS_summary;
    so.term_grace_s = FLAGS_term_grace;
    for (const char* flag :
         {"cluster", "auth_token_file", "etcd", "cluster_name", "k", "r", "layout", "spares"}) {
      const auto info = gflags::GetCommandLineFlagInfoOrDie(flag);
      if (!info.is_default)
        so.swap_flags.push_back("--" + std::string(flag) + "=" + info.current_value);
    }
    return run::RunWithSwapPager(so);
  }
  const bool is_static = StaticallyLinked(*program);
  if (is_static) {
    std::fprintf(stderr,
                 "tessera run: warning: %s is statically linked: the userfaultfd pager reaches "
                 "programs through LD_PRELOAD and cannot page it; running it unpaged (`tessera "
                 "swap` pages every process, static ones included)\n",
                 program->c_str());
  }
  if (Status st = ProbeUserfaultfd(); !st.ok()) {
    std::fprintf(stderr, "tessera run: cannot page programs: %s\n", st.message().c_str());
    return 1;
  }
  // Beside the build's bin/ (build/lib), or where `cmake --install` puts it relative to the
  // subcommand directory (TESSERA_PRELOAD_RELDIR, e.g. ../../lib from libexec/tessera).
  std::string lib = SelfExeDir() + "/../lib/" + kernel_shim::kPreloadName;
  if (access(lib.c_str(), R_OK) != 0) {
    const std::string installed =
        SelfExeDir() + "/" + TESSERA_PRELOAD_RELDIR + "/" + kernel_shim::kPreloadName;
    if (access(installed.c_str(), R_OK) != 0) {
      std::fprintf(stderr,
                   "tessera run: %s is missing (neither %s nor %s exists; build the "
                   "tessera_preload target)\n",
                   kernel_shim::kPreloadName, lib.c_str(), installed.c_str());
      return 1;
    }
    lib = installed;
  }
  char real_lib[PATH_MAX];
  if (realpath(lib.c_str(), real_lib) == nullptr) {
    std::fprintf(stderr, "tessera run: %s: %s\n", lib.c_str(), strerror(errno));
    return 1;
  }

  char tmpl[] = "/tmp/tessera-run-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::fprintf(stderr, "tessera run: mkdtemp: %s\n", strerror(errno));
    return 1;
  }
  const std::string tmpdir = tmpl;
  const std::string stats_path = tmpdir + "/stats";
  const std::string live_path = FLAGS_live_stats_file.empty() ? tmpdir + "/live" : FLAGS_live_stats_file;
  struct Cleanup {
    std::string dir, stats, live;
    ~Cleanup() {
      // The stats files of the processes the program started (stats.<pid>).
      if (DIR* d = opendir(dir.c_str())) {
        while (struct dirent* e = readdir(d)) {
          if (std::strncmp(e->d_name, "stats.", 6) == 0) unlink((dir + "/" + e->d_name).c_str());
        }
        closedir(d);
      }
      unlink(stats.c_str());
      unlink((stats + ".tmp").c_str());
      if (live.rfind(dir, 0) == 0) {
        unlink(live.c_str());
        unlink((live + ".tmp").c_str());
      }
      rmdir(dir.c_str());
    }
  } cleanup{tmpdir, stats_path, live_path};
  // --etcd: the membership mirrored into a cluster file the shim follows (kEnvFollow).
  const std::string members_path = tmpdir + "/members";
  struct UnlinkMembers {
    std::string path;
    ~UnlinkMembers() {
      unlink(path.c_str());
      unlink((path + ".tmp").c_str());
    }
  };
  std::unique_ptr<UnlinkMembers> unlink_members;
  std::optional<cli::ClusterSource> etcd_source;
  std::unique_ptr<MembersFile> members_file;

  std::unique_ptr<client::LocalCluster> cluster;
  std::string cluster_file = cf.cluster, token = cf.auth_token_file, where;
  const size_t servers_wanted = sf.EmbeddedServers();
  if (!cf.etcd.empty()) {
    auto src = cli::ResolveCluster("", cf.etcd, cf.cluster_name);
    if (!src.ok() && src.status().code() == StatusCode::kInvalidArgument) {
      cli::UsageError(kSpec, src.status().message());
    }
    if (!src.ok()) {
      std::fprintf(stderr, "tessera run: --etcd %s: %s\n", cf.etcd.c_str(),
                   src.status().ToString().c_str());
      return 1;
    }
    if (src->servers.size() < static_cast<size_t>(sf.k + sf.r)) {
      std::fprintf(stderr,
                   "tessera run: etcd cluster '%s' has %zu registered servers; RS(k,r) needs at "
                   "least k+r = %d\n",
                   cf.cluster_name.c_str(), src->servers.size(), sf.k + sf.r);
      return 1;
    }
    etcd_source = std::move(*src);
    unlink_members = std::make_unique<UnlinkMembers>(UnlinkMembers{members_path});
    auto mf = MembersFile::Start(members_path, etcd_source->view.get());
    if (!mf.ok()) {
      std::fprintf(stderr, "tessera run: %s\n", mf.status().ToString().c_str());
      return 1;
    }
    members_file = std::move(*mf);
    cluster_file = members_path;
    where = std::to_string(etcd_source->servers.size()) + " memservers of etcd cluster " +
            cf.cluster_name;
  } else if (cluster_file.empty()) {
    client::LocalClusterOptions lo;
    lo.bin_dir = SelfExeDir();
    lo.servers = servers_wanted;
    // Each server holds 1/k of the region's pages at most (virtual until used), plus slack
    // for regenerated splits of failed servers.
    const uint64_t per_server_mb = *region / static_cast<uint64_t>(sf.k) / (1 << 20) * 2 + 64;
    lo.capacity = std::to_string(per_server_mb) + "M";
    lo.slab_size = "1M";
    auto c = client::LocalCluster::Start(lo);
    if (!c.ok()) {
      std::fprintf(stderr, "tessera run: starting the local cluster: %s\n",
                   c.status().ToString().c_str());
      return 1;
    }
    cluster = std::move(*c);
    cluster_file = cluster->cluster_file_path();
    token = cluster->token_path();
    where = std::to_string(servers_wanted) + " local memservers";
  } else {
    auto servers = client::LoadServers(cluster_file);
    if (!servers.ok()) {
      std::fprintf(stderr, "tessera run: --cluster %s: %s\n", cluster_file.c_str(),
                   servers.status().ToString().c_str());
      return 2;
    }
    if (servers->size() < static_cast<size_t>(sf.k + sf.r)) {
      cli::UsageError(kSpec, "--cluster lists " + std::to_string(servers->size()) +
                                 " servers; RS(k,r) needs at least k+r = " +
                                 std::to_string(sf.k + sf.r));
    }
    where = std::to_string(servers->size()) + " memservers of " + cluster_file;
  }

  std::vector<std::string> env = {
      std::string(kernel_shim::kEnvCluster) + "=" + cluster_file,
      std::string(kernel_shim::kEnvToken) + "=" + token,
      std::string(kernel_shim::kEnvK) + "=" + std::to_string(sf.k),
      std::string(kernel_shim::kEnvR) + "=" + std::to_string(sf.r),
      std::string(kernel_shim::kEnvLocal) + "=" + FLAGS_local_memory,
      std::string(kernel_shim::kEnvCompressedTier) + "=" + FLAGS_compressed_tier,
      std::string(kernel_shim::kEnvRegion) + "=" + std::to_string(*region),
      std::string(kernel_shim::kEnvStats) + "=" + stats_path,
      std::string(kernel_shim::kEnvLive) + "=" + live_path,
      std::string(kernel_shim::kEnvWriteTraps) + "=" +
          (gflags::GetCommandLineFlagInfoOrDie("write_traps").is_default
               ? "auto"
               : (FLAGS_write_traps ? "1" : "0")),
      std::string(kernel_shim::kEnvInactiveList) + "=" + (FLAGS_inactive_list ? "1" : "0"),
      std::string(kernel_shim::kEnvDirectReads) + "=" + (FLAGS_direct_reads ? "1" : "0"),
      std::string(kernel_shim::kEnvBatchFaults) + "=" + (FLAGS_batch_faults ? "1" : "0"),
      std::string(kernel_shim::kEnvFaultSpin) + "=" + std::to_string(FLAGS_fault_spin_us),
      std::string(kernel_shim::kEnvLayout) + "=" + layout_name,
      std::string(kernel_shim::kEnvFollow) + "=" + (members_file ? "1" : "0"),
  };
  if (FLAGS_direct_spin_us >= 0) {
    env.push_back(std::string(kernel_shim::kEnvDirectSpin) + "=" + std::to_string(FLAGS_direct_spin_us));
  }
  // The shim logs warnings (e.g. a memserver declared failed) unless --log_level was given.
  if (!gflags::GetCommandLineFlagInfoOrDie("log_level").is_default) {
    env.push_back(std::string(kernel_shim::kEnvLogLevel) + "=" +
                  gflags::GetCommandLineFlagInfoOrDie("log_level").current_value);
  }
  const char* old_preload = getenv("LD_PRELOAD");
  env.push_back(std::string("LD_PRELOAD=") + real_lib +
                (old_preload && *old_preload ? std::string(":") + old_preload : ""));

  // The child's environment, built before fork (the child only calls execve).
  std::vector<std::string> full_env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    std::string key = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& mine : env) replaced |= mine.compare(0, key.size() + 1, key + "=") == 0;
    if (!replaced) full_env.push_back(entry);
  }
  full_env.insert(full_env.end(), env.begin(), env.end());
  std::vector<char*> cenv, cargv;
  for (auto& e : full_env) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);

  // --metrics-port: the pager's live stats as Prometheus text, announced on stderr (stdout is
  // the program's).
  std::unique_ptr<memserver::MetricsHttpServer> metrics;
  if (sf.metrics_port >= 0) {
    auto m = cli::ServeClientMetrics(
        "127.0.0.1", sf.metrics_port, "run", nullptr,
        [live_path] { return run::RunMetrics(kernel_shim::ParseRunStats(ReadFile(live_path))); },
        stderr);
    if (!m.ok()) {
      std::fprintf(stderr, "tessera run: metrics: %s\n", m.status().ToString().c_str());
      return 1;
    }
    metrics = std::move(*m);
  }

  const uint64_t t0 = MonotonicNs();
  const pid_t getpid_before_fork = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    std::fprintf(stderr, "tessera run: fork: %s\n", strerror(errno));
    return 1;
  }
  if (pid == 0) {
    // The program dies with the launcher (an embedded cluster, and so its memory, would too).
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != getpid_before_fork) _exit(1);
    execve(program->c_str(), cargv.data(), cenv.data());
    const int err = errno;
    const char msg[] = "tessera run: exec failed\n";
    (void)!write(2, msg, sizeof(msg) - 1);
    _exit(err == ENOENT ? 127 : 126);
  }
  g_child = pid;
  struct sigaction sa = {};
  sa.sa_sigaction = ForwardSignal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) sigaction(sig, &sa, nullptr);

  const bool tty = FLAGS_progress && isatty(2);
  bool progress_shown = false;
  int wstatus = 0;
  uint64_t last_progress = 0;
  uint64_t term_at = 0;  // When the first termination request was seen (0: none).
  bool killed_after_grace = false;
  for (;;) {
    pid_t w = waitpid(pid, &wstatus, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) {
      std::fprintf(stderr, "tessera run: waitpid: %s\n", strerror(errno));
      return 1;
    }
    usleep(50 * 1000);  // Polling the child's exit and the live stats; not synchronisation.
    const uint64_t now = MonotonicNs();
    if (g_term_requested && term_at == 0) term_at = now;
    if (term_at != 0 && !killed_after_grace &&
        static_cast<double>(now - term_at) / 1e9 > FLAGS_term_grace) {
      std::fprintf(stderr,
                   "%stessera run: the program did not exit within --term-grace %.1f s of the "
                   "termination signal; sending SIGKILL\n",
                   progress_shown ? "\r\033[K" : "", FLAGS_term_grace);
      kill(pid, SIGKILL);
      killed_after_grace = true;
    }
    if (tty && now - t0 > 3'000'000'000ull && now - last_progress > 1'000'000'000ull) {
      last_progress = now;
      PrintProgress(kernel_shim::ParseRunStats(ReadFile(live_path)), (now - t0) / 1e9);
      progress_shown = true;
    }
  }
  const double secs = (MonotonicNs() - t0) / 1e9;
  if (progress_shown) std::fprintf(stderr, "\r\033[K");
  std::string how;
  int code = run::DescribeExit(wstatus, &how);

  std::string shim_error;
  bool have_root = false;
  kernel_shim::RunStats stats = TreeStats(tmpdir, stats_path, &shim_error, &have_root);
  bool final = have_root || !shim_error.empty();
  if (!final) {
    // The first program did not exit normally: its last live snapshot, with the final stats
    // of the processes it started.
    std::vector<kernel_shim::RunStats> each = {
        kernel_shim::ParseRunStats(ReadFile(live_path), &shim_error)};
    if (each[0].empty()) each.clear();
    if (!stats.empty()) each.push_back(stats);
    stats = each.empty() ? kernel_shim::RunStats{} : kernel_shim::MergeRunStats(each);
  }
  if (!shim_error.empty()) {
    std::fprintf(stderr, "tessera run: paging could not start: %s\n", shim_error.c_str());
    return code == 0 ? 1 : code;
  }

  const uint64_t failures = Get(stats, "store_server_failures");
  if (FLAGS_summary) {
    std::string limit = FLAGS_local_memory;
    std::fprintf(stderr,
                 "tessera run: %s after %.2f s; RS(%d,%d) %s layout over %s; local memory %s%s\n",
                 how.c_str(), secs, sf.k, sf.r, layout_name.c_str(), where.c_str(), limit.c_str(),
                 stats.empty() ? " (no stats: the program ended before the shim wrote any)"
                 : final       ? ""
                               : " (stats: last live snapshot, the program did not exit normally)");
    if (!stats.empty()) {
      std::fprintf(stderr,
                   "  heap: peak footprint %s, peak resident %s, limit at exit %s\n"
                   "  faults %llu (zero-fill %llu, mapping %llu more never-written pages around "
                   "them), write-protect faults %llu\n"
                   "  remote reads %llu, remote writes %llu, clean drops %llu, evictions %llu\n"
                   "  prefetch: %llu pages issued, %llu hits\n"
                   "  fault latency p50 %s, p99 %s (PageStore read p50 %s)\n"
                   "  memserver failures survived %llu, data loss %llu, fill errors %llu\n",
                   Mb(Get(stats, "peak_footprint_pages")).c_str(),
                   Mb(Get(stats, "peak_resident_pages")).c_str(),
                   Get(stats, "limit_pages") ? Mb(Get(stats, "limit_pages")).c_str() : "none",
                   static_cast<unsigned long long>(Get(stats, "faults")),
                   static_cast<unsigned long long>(Get(stats, "zero_fills")),
                   static_cast<unsigned long long>(Get(stats, "zero_fill_around")),
                   static_cast<unsigned long long>(Get(stats, "wp_faults")),
                   static_cast<unsigned long long>(Get(stats, "remote_reads")),
                   static_cast<unsigned long long>(Get(stats, "remote_writes")),
                   static_cast<unsigned long long>(Get(stats, "clean_drops")),
                   static_cast<unsigned long long>(Get(stats, "evictions")),
                   static_cast<unsigned long long>(Get(stats, "prefetch_issued")),
                   static_cast<unsigned long long>(Get(stats, "prefetch_hits")),
                   Us(Get(stats, "fault_p50_ns")).c_str(), Us(Get(stats, "fault_p99_ns")).c_str(),
                   Us(Get(stats, "store_read_p50_ns")).c_str(),
                   static_cast<unsigned long long>(failures),
                   static_cast<unsigned long long>(Get(stats, "store_data_loss")),
                   static_cast<unsigned long long>(Get(stats, "fill_errors")));
      if (tier->enabled) {
        std::fprintf(stderr,
                     "  compressed tier: %llu hits, %llu misses; %llu pages stored, %llu "
                     "incompressible, %llu written back; %s at exit (capacity %s); memservers "
                     "%llu page reads, %llu page writes\n",
                     static_cast<unsigned long long>(Get(stats, "tier_hits")),
                     static_cast<unsigned long long>(Get(stats, "tier_misses")),
                     static_cast<unsigned long long>(Get(stats, "tier_stored")),
                     static_cast<unsigned long long>(Get(stats, "tier_incompressible")),
                     static_cast<unsigned long long>(Get(stats, "tier_writebacks")),
                     FormatSize(Get(stats, "tier_charged_bytes")).c_str(),
                     FormatSize(Get(stats, "tier_capacity_bytes")).c_str(),
                     static_cast<unsigned long long>(Get(stats, "store_reads")),
                     static_cast<unsigned long long>(Get(stats, "store_writes")));
      }
      if (Get(stats, "fork_snapshots") + Get(stats, "fork_fallbacks") > 0) {
        // fork() without exec (docs/guides/what-is-paged.md, "fork").
        std::fprintf(stderr,
                     "  fork: %llu children shared the heap through the store (child peak "
                     "resident %s, its limit %s, %s it wrote; %llu pages copied aside, %llu held "
                     "local for lack of spare store pages), %llu paged the heap in first\n",
                     static_cast<unsigned long long>(Get(stats, "fork_snapshots")),
                     Mb(Get(stats, "fork_child_peak_resident_pages")).c_str(),
                     Mb(Get(stats, "fork_child_limit_pages")).c_str(),
                     Mb(Get(stats, "fork_child_peak_dirty_pages")).c_str(),
                     static_cast<unsigned long long>(Get(stats, "fork_preserved")),
                     static_cast<unsigned long long>(Get(stats, "fork_pinned")),
                     static_cast<unsigned long long>(Get(stats, "fork_fallbacks")));
      }
      if (Get(stats, "processes") > 1) {
        std::fprintf(stderr,
                     "  processes paged: %llu (the program and those it started; one "
                     "local-memory budget each, figures summed)\n",
                     static_cast<unsigned long long>(Get(stats, "processes")));
      }
      const std::string left = NotPagedText(stats);
      std::fprintf(stderr, "  not paged: %s\n", left.empty() ? "nothing left out" : left.c_str());
    } else if (is_static) {
      std::fprintf(stderr, "  not paged: the whole program (statically linked)\n");
    }
  }
  if (!FLAGS_stats_json.empty()) {
    nlohmann::ordered_json out;
    out["exit_code"] = code;
    out["status"] = how;
    out["elapsed_s"] = secs;
    out["layout"] = layout_name;
    out["k"] = sf.k;
    out["r"] = sf.r;
    out["local_memory"] = FLAGS_local_memory;
    out["compressed_tier"] = FLAGS_compressed_tier;
    out["servers"] = where;
    out["stats_final"] = final;
    out["statically_linked"] = is_static;
    out["failures_survived"] = failures;
    for (const auto& [key, v] : stats) {
      // The fault latency's histogram buckets are for the metrics endpoint; p50/p99 stay.
      if (key.rfind(kernel_shim::kFaultBucketPrefix, 0) == 0) continue;
      out[key] = v;  // uint64 stays uint64.
    }
    const std::string j =
        out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
    Status st = WriteFileAtomically(FLAGS_stats_json, j);
    if (!st.ok()) {
      std::fprintf(stderr, "tessera run: --stats-json: %s\n", st.ToString().c_str());
      if (code == 0) code = 1;
    }
  }
  return code;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) { return tessera::Main(argc, argv); }
