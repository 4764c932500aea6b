// `tessera`: the user-facing command. Each subcommand is its own executable beside this one
// (`tessera bench coding` runs build/bin/tessera-bench-coding), or in PREFIX/libexec/tessera
// once installed, in the manner of git, so each tool parses only its own flags and a bad flag
// is reported by the tool that owns it.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "apps/cli/version.h"
#include "common/subprocess.h"

namespace {

struct Subcommand {
  const char* words;  // "bench coding"
  const char* help;
};

// Every subcommand Tessera knows, in the order `tessera help` lists them. Only those whose
// executable is built are listed.
const Subcommand kSubcommands[] = {
    {"demo cluster", "store pages on local memservers, kill r of them, verify every page"},
    {"demo", "encode pages, lose r splits, rebuild them, and print the figures"},
    {"run", "run an unmodified program with its heap paged to remote memory"},
    {"memserver", "run a memory server daemon that lends memory in slabs"},
    {"cluster up", "memservers on separate hosts of this machine (namespaces, pinned cores)"},
    {"status", "list the servers of a cluster with their slabs, load and health"},
    {"fault", "inject a fault into a running memory server (latency, hang, crash, ...)"},
    {"token", "make a cluster secret, issue per-client credentials, show a credential"},
    {"nbd", "serve the resilient page store as a Network Block Device export"},
    {"swap", "a kernel swap device on the resilient page store (FUSE file, loop, swapon)"},
    {"experiment", "run failure-injection experiments from scenario files (TOML)"},
    {"kv", "get/put/delete keys of a KV table on memservers, invoke offload functions"},
    {"sim placement", "simulate placement policies under correlated failures"},
    {"bench coding", "erasure-coding throughput: ISA-L RS vs Jerasure vs replication"},
    {"bench fabric", "one-sided read/write latency and throughput vs memcached"},
    {"bench pagestore", "page store latency/throughput: EC vs replication vs local SSD"},
    {"bench pager", "paging of unmodified workloads vs kernel swap"},
    {"bench programs", "python3, GNU sort and redis locally, under tessera run and under swap"},
    {"bench nbd", "NBD export vs a file-backed NBD server"},
    {"bench trim", "freeing remote memory with Trim vs overwriting it with zeros"},
    {"bench failover", "failure detection, regeneration, read p99 under faults, load and etcd outages"},
    {"paramsvc serve", "run the Parameter Service (model aggregation) on a memserver host"},
    {"paramsvc status", "show a Parameter Service's jobs, cores and counters"},
    {"paramsvc move", "move a training job to another Parameter Service while it trains"},
    {"paramsvc drain", "move every job off a Parameter Service and send new ones elsewhere"},
    {"paramsvc rebalance", "move jobs off overloaded Parameter Services by measured load"},
    {"bench paramsvc", "Parameter Service: summation, packing, vs gloo allreduce, staleness"},
    {"bench kayak", "KV vs RPC offload chosen adaptively under a p99 SLO, vs Redis GET/FCALL"},
};

bool IsExecutable(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::string ToolPath(const std::string& dir, const char* words) {
  std::string name = "tessera-";
  for (const char* p = words; *p; ++p) name += (*p == ' ') ? '-' : *p;
  return dir + "/" + name;
}

// `tessera GROUP --help` (or `tessera GROUP` alone) for a word that only starts subcommands
// (bench, paramsvc, sim): lists that group's subcommands. False when GROUP is no such word.
bool PrintGroupHelp(FILE* out, const std::string& dir, const std::string& group) {
  const std::string prefix = group + " ";
  bool any = false;
  for (const auto& s : kSubcommands) {
    if (std::string(s.words).rfind(prefix, 0) != 0) continue;
    if (!any) {
      std::fprintf(out, "usage: tessera %s SUBCOMMAND [FLAGS] [ARGS]\n\nsubcommands:\n",
                   group.c_str());
      any = true;
    }
    if (IsExecutable(ToolPath(dir, s.words))) std::fprintf(out, "  %-20s %s\n", s.words, s.help);
  }
  if (any) {
    std::fprintf(out, "\n`tessera %s SUBCOMMAND --help` shows the flags of one subcommand.\n",
                 group.c_str());
  }
  return any;
}

bool IsGroupOnly(const std::string& word) {
  for (const auto& s : kSubcommands) {
    if (word == s.words) return false;  // `demo` is a subcommand as well as a group.
  }
  for (const auto& s : kSubcommands) {
    if (std::string(s.words).rfind(word + " ", 0) == 0) return true;
  }
  return false;
}

void PrintHelp(FILE* out, const std::string& dir) {
  std::fprintf(out,
               "usage: tessera SUBCOMMAND [FLAGS] [ARGS]\n\n"
               "Tessera: erasure-coded, failure-resilient remote memory.\n\n"
               "subcommands:\n");
  for (const auto& s : kSubcommands) {
    if (IsExecutable(ToolPath(dir, s.words))) std::fprintf(out, "  %-20s %s\n", s.words, s.help);
  }
  std::fprintf(out, "\n`tessera SUBCOMMAND --help` shows the flags of one subcommand.\n");
}

}  // namespace

// Where the subcommand executables are: beside this one (the build tree, and the copy of
// `tessera` installed among them), else in PREFIX/libexec/tessera (installed, as git does).
std::string ToolDir() {
  const std::string self = tessera::SelfExeDir();
  if (IsExecutable(ToolPath(self, "memserver"))) return self;
  const std::string libexec = self + "/" + TESSERA_LIBEXEC_RELDIR;
  if (IsExecutable(ToolPath(libexec, "memserver"))) return libexec;
  return self;
}

int main(int argc, char** argv) {
  std::string dir = ToolDir();
  if (argc < 2) {
    PrintHelp(stderr, dir);
    return 2;
  }
  std::string first = argv[1];
  if (first == "help" || first == "--help" || first == "-h") {
    PrintHelp(stdout, dir);
    return 0;
  }
  if (first == "--version" || first == "version") {
    std::fputs(tessera::version::Text("tessera").c_str(), stdout);
    return 0;
  }
  if (IsGroupOnly(first)) {
    const bool help = argc == 3 && (std::strcmp(argv[2], "--help") == 0 ||
                                    std::strcmp(argv[2], "-h") == 0 ||
                                    std::strcmp(argv[2], "help") == 0);
    if (argc == 2 || help) {
      PrintGroupHelp(help ? stdout : stderr, dir, first);
      return help ? 0 : 2;
    }
  }
  // Longest match first: `tessera bench coding` before `tessera bench`.
  for (int words = 2; words >= 1; --words) {
    if (argc < 1 + words) continue;
    std::string joined;
    bool flaglike = false;
    for (int i = 1; i <= words; ++i) {
      if (argv[i][0] == '-') flaglike = true;
      if (i > 1) joined += ' ';
      joined += argv[i];
    }
    if (flaglike) continue;
    bool known = false;
    for (const auto& s : kSubcommands) known = known || joined == s.words;
    if (!known) continue;
    std::string tool = ToolPath(dir, joined.c_str());
    if (!IsExecutable(tool)) {
      std::fprintf(stderr, "tessera: '%s' is not built (missing %s)\n", joined.c_str(),
                   tool.c_str());
      return 2;
    }
    std::vector<char*> args;
    std::string shown = "tessera " + joined;
    args.push_back(shown.data());
    for (int i = 1 + words; i < argc; ++i) args.push_back(argv[i]);
    args.push_back(nullptr);
    ::execv(tool.c_str(), args.data());
    std::fprintf(stderr, "tessera: cannot run %s: %s\n", tool.c_str(), std::strerror(errno));
    return 127;
  }
  std::fprintf(stderr, "tessera: unknown subcommand '%s'\n\n", first.c_str());
  PrintHelp(stderr, dir);
  return 2;
}
