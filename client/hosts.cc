#include "client/hosts.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "common/clock.h"
#include "common/fd.h"
#include "common/subprocess.h"

namespace tessera::client {

const char* HostsModeName(HostsMode mode) {
  return mode == HostsMode::kNetns ? "netns" : "loopback";
}

Result<HostsMode> ParseHostsMode(std::string_view text) {
  if (text == "loopback") return HostsMode::kLoopback;
  if (text == "netns") return HostsMode::kNetns;
  return InvalidArgument("hosts must be 'loopback' or 'netns', got '", std::string(text), "'");
}

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

PinPlan AutoPin(const std::vector<int>& allowed) {
  PinPlan plan;
  if (allowed.size() < 2) return plan;
  plan.client = {allowed[0]};
  plan.servers.assign(allowed.begin() + 1, allowed.end());
  return plan;
}

namespace {

Result<int> ParseCpu(std::string_view s, std::string_view entry) {
  if (s.empty() || s.size() > 4 || !std::all_of(s.begin(), s.end(), [](char c) {
        return c >= '0' && c <= '9';
      })) {
    return InvalidArgument("--pin: '", std::string(entry), "': '", std::string(s),
                           "' is not a CPU number");
  }
  return std::stoi(std::string(s));
}

}  // namespace

Result<PinPlan> ParsePin(std::string_view text) { return ParsePin(text, AllowedCpus()); }

Result<PinPlan> ParsePin(std::string_view text, const std::vector<int>& allowed) {
  if (text.empty() || text == "none") return PinPlan{};
  if (text == "auto") return AutoPin(allowed);
  PinPlan plan;
  bool saw_client = false, saw_servers = false;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    const std::string_view entry = text.substr(start, comma - start);
    start = comma + 1;
    const size_t colon = entry.find(':');
    if (colon == std::string_view::npos) {
      return InvalidArgument("--pin: '", std::string(entry),
                             "' is not ROLE:CPUS (e.g. client:0,servers:1)");
    }
    const std::string_view role = entry.substr(0, colon);
    const std::string_view cpus = entry.substr(colon + 1);
    std::vector<int>* out = nullptr;
    if (role == "client") {
      if (saw_client) return InvalidArgument("--pin: 'client' is named twice");
      saw_client = true;
      out = &plan.client;
    } else if (role == "servers") {
      if (saw_servers) return InvalidArgument("--pin: 'servers' is named twice");
      saw_servers = true;
      out = &plan.servers;
    } else {
      return InvalidArgument("--pin: unknown role '", std::string(role),
                             "' (client or servers)");
    }
    if (cpus.empty()) {
      return InvalidArgument("--pin: '", std::string(entry), "' names no CPU");
    }
    size_t gstart = 0;
    while (gstart <= cpus.size()) {  // Groups `N` or `A-B`, joined by '+'.
      size_t plus = cpus.find('+', gstart);
      if (plus == std::string_view::npos) plus = cpus.size();
      const std::string_view group = cpus.substr(gstart, plus - gstart);
      gstart = plus + 1;
      const size_t dash = group.find('-');
      TESSERA_ASSIGN_OR_RETURN(int first, ParseCpu(group.substr(0, dash), entry));
      int last = first;
      if (dash != std::string_view::npos) {
        TESSERA_ASSIGN_OR_RETURN(last, ParseCpu(group.substr(dash + 1), entry));
      }
      if (last < first) {
        return InvalidArgument("--pin: '", std::string(entry), "': the range is backwards");
      }
      for (int c = first; c <= last; ++c) {
        if (std::find(allowed.begin(), allowed.end(), c) == allowed.end()) {
          return InvalidArgument("--pin: CPU ", c, " is not one this process may use (",
                                 allowed.size(), " allowed)");
        }
        if (std::find(out->begin(), out->end(), c) != out->end()) {
          return InvalidArgument("--pin: '", std::string(entry), "' names CPU ", c, " twice");
        }
        out->push_back(c);
      }
      if (plus == cpus.size()) break;
    }
    if (comma == text.size()) break;
  }
  return plan;
}

namespace {

std::string FormatCpus(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += '+';
    out += std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace

std::string FormatPin(const PinPlan& plan) {
  if (plan.empty()) return "none";
  std::string out;
  if (!plan.client.empty()) out = "client:" + FormatCpus(plan.client);
  if (!plan.servers.empty()) {
    out += (out.empty() ? "" : ",") + std::string("servers:") + FormatCpus(plan.servers);
  }
  return out;
}

Status PinCallingThread(const std::vector<int>& cpus) {
  if (cpus.empty()) return Status::Ok();
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) {
    if (c < 0 || c >= CPU_SETSIZE) return InvalidArgument("no CPU ", c);
    CPU_SET(c, &set);
  }
  if (::sched_setaffinity(0, sizeof set, &set) != 0) return ErrnoError("sched_setaffinity");
  return Status::Ok();
}

namespace {

constexpr int kSubnets = 512;  // /24s in 198.18.0.0/15.
constexpr const char* kClaimDir = "/run/tessera-hosts";

// "198.18.K/256.K%256.HOST" for subnet K.
std::string Address(int subnet, int host) {
  return "198." + std::to_string(18 + subnet / 256) + "." + std::to_string(subnet % 256) + "." +
         std::to_string(host);
}

std::string NetnsName(int subnet, size_t i) {
  return "tessera-" + std::to_string(subnet) + "-" + std::to_string(i);
}
std::string BridgeName(int subnet) { return "tsb" + std::to_string(subnet); }
std::string VethName(int subnet, size_t i) {
  return "tsv" + std::to_string(subnet) + "h" + std::to_string(i);
}
std::string ClaimPath(int subnet) {
  return std::string(kClaimDir) + "/net-" + std::to_string(subnet);
}

std::string IpTool() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

// Runs `ip ARGS...`; the error carries what it printed.
Status Ip(const std::vector<std::string>& args) {
  const std::string ip = IpTool();
  if (ip.empty()) return Unsupported("no `ip` tool (iproute2) in /usr/sbin, /sbin, /usr/bin, /bin");
  std::vector<std::string> argv = {ip};
  argv.insert(argv.end(), args.begin(), args.end());
  Subprocess::Options so;
  so.capture_stdout = true;
  so.stderr_to_stdout = true;
  TESSERA_ASSIGN_OR_RETURN(Subprocess p, Subprocess::Start(argv, so));
  const Deadline deadline = Deadline::AfterMs(10000);
  std::string output;
  for (;;) {
    auto line = p.ReadLine(deadline);
    if (!line.ok()) break;
    output += (output.empty() ? "" : "; ") + *line;
  }
  auto ws = p.Wait(deadline);
  if (!ws.ok()) return Timeout("`ip` did not finish within 10 s");
  if (!WIFEXITED(*ws) || WEXITSTATUS(*ws) != 0) {
    std::string cmd = "ip";
    for (const auto& a : args) cmd += " " + a;
    return IoError("`", cmd, "` failed: ", output.empty() ? "no output" : output);
  }
  return Status::Ok();
}

// The start time of `pid` (field 22 of /proc/PID/stat), or "" if there is no such process.
std::string StartTime(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return "";
  std::istringstream fields(stat.substr(close + 2));
  std::string f;
  for (int i = 3; fields >> f; ++i) {
    if (i == 22) return f;
  }
  return "";
}

// True while the claim's owner (the "PID STARTTIME" in the file) is alive. An unreadable or
// malformed claim counts as alive: it is never swept.
bool OwnerAlive(const std::string& claim) {
  std::ifstream in(claim);
  long pid = 0;
  std::string start;
  if (!(in >> pid >> start) || pid <= 0) return true;
  const std::string now = StartTime(static_cast<pid_t>(pid));
  return !now.empty() && now == start;
}

bool LinkExists(const std::string& name) {
  return ::access(("/sys/class/net/" + name).c_str(), F_OK) == 0;
}

// Removes everything named after subnet K (errors ignored: some of it may be gone already),
// then the claim.
void RemoveSubnet(int subnet) {
  std::error_code ec;
  const std::string prefix = "tessera-" + std::to_string(subnet) + "-";
  for (const auto& e : std::filesystem::directory_iterator("/run/netns", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) (void)Ip({"netns", "del", name});
  }
  const std::string veth = "tsv" + std::to_string(subnet) + "h";
  for (const auto& e : std::filesystem::directory_iterator("/sys/class/net", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(veth, 0) == 0) (void)Ip({"link", "del", name});
  }
  if (LinkExists(BridgeName(subnet))) (void)Ip({"link", "del", BridgeName(subnet)});
  ::unlink(ClaimPath(subnet).c_str());
}

// The lock every sweep and claim is made under.
Result<UniqueFd> LockClaims() {
  if (::mkdir(kClaimDir, 0755) != 0 && errno != EEXIST) {
    return ErrnoError("cannot create ", kClaimDir);
  }
  const std::string path = std::string(kClaimDir) + "/lock";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd) return ErrnoError("cannot open ", path);
  while (::flock(fd.get(), LOCK_EX) != 0) {
    if (errno != EINTR) return ErrnoError("flock ", path);
  }
  return fd;
}

Result<size_t> SweepLocked() {
  // A claim being written when its owner died (see ClaimLocked).
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(kClaimDir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("claim.", 0) != 0) continue;
    const long pid = std::atol(name.c_str() + 6);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      ::unlink(e.path().c_str());
    }
  }
  size_t swept = 0;
  for (int k = 0; k < kSubnets; ++k) {
    const std::string claim = ClaimPath(k);
    if (::access(claim.c_str(), F_OK) != 0 || OwnerAlive(claim)) continue;
    RemoveSubnet(k);
    ++swept;
  }
  return swept;
}

// Claims the first free subnet: the claim is written aside, then linked into place (link fails
// if the name exists), so a claim is never seen half written.
Result<int> ClaimLocked() {
  const std::string mine = std::string(kClaimDir) + "/claim." + std::to_string(::getpid());
  {
    std::ofstream out(mine, std::ios::trunc);
    out << ::getpid() << " " << StartTime(::getpid()) << "\n";
    out.close();
    if (!out) return IoError("cannot write ", mine);
  }
  for (int k = 0; k < kSubnets; ++k) {
    if (::link(mine.c_str(), ClaimPath(k).c_str()) == 0) {
      ::unlink(mine.c_str());
      return k;
    }
    if (errno != EEXIST) {
      const Status st = ErrnoError("cannot claim ", ClaimPath(k));
      ::unlink(mine.c_str());
      return st;
    }
  }
  ::unlink(mine.c_str());
  return ResourceExhausted("every /24 of 198.18.0.0/15 is claimed (", kSubnets,
                           " harnesses are running)");
}

// Waits (bounded) until `link` is operationally up: both veth ends are up and carry frames.
Status WaitLinkUp(const std::string& link) {
  const Deadline d = Deadline::AfterMs(5000);
  for (;;) {
    std::ifstream in("/sys/class/net/" + link + "/operstate");
    std::string state;
    in >> state;
    if (state == "up") return Status::Ok();
    if (d.Expired()) return Timeout("link ", link, " is not up 5 s after being set up (", state, ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

Result<size_t> NetHosts::SweepLeftovers() {
  if (::access(kClaimDir, F_OK) != 0) return size_t{0};
  TESSERA_ASSIGN_OR_RETURN(UniqueFd lock, LockClaims());
  return SweepLocked();
}

Result<std::unique_ptr<NetHosts>> NetHosts::Create(size_t count) {
  if (count < 1 || count > 200) {
    return InvalidArgument("NetHosts: 1..200 hosts, got ", count);
  }
  if (IpTool().empty()) {
    return Unsupported("cannot create network namespaces: no `ip` tool (iproute2) installed");
  }
  if (::geteuid() != 0) {
    return PermissionDenied("cannot create network namespaces: not root (needs CAP_SYS_ADMIN "
                            "and CAP_NET_ADMIN)");
  }
  std::unique_ptr<NetHosts> hosts(new NetHosts());
  {
    auto lock = LockClaims();
    if (!lock.ok()) return lock.status().WithContext("cannot create network namespaces");
    TESSERA_ASSIGN_OR_RETURN(size_t swept, SweepLocked());
    (void)swept;
    TESSERA_ASSIGN_OR_RETURN(hosts->subnet_, ClaimLocked());
  }
  // From here the destructor removes whatever was made.
  const int k = hosts->subnet_;
  hosts->bridge_ = BridgeName(k);
  hosts->gateway_ = Address(k, 1);
  auto fail = [](const Status& st) {
    return Status(st.code(), "cannot create network namespaces: " + st.message());
  };
  Status st = Ip({"link", "add", hosts->bridge_, "type", "bridge"});
  if (st.ok()) st = Ip({"addr", "add", hosts->gateway_ + "/24", "dev", hosts->bridge_});
  if (st.ok()) st = Ip({"link", "set", hosts->bridge_, "up"});
  if (!st.ok()) return fail(st);
  for (size_t i = 0; i < count; ++i) {
    NetHost h;
    h.netns = NetnsName(k, i);
    h.netns_path = "/run/netns/" + h.netns;
    h.address = Address(k, static_cast<int>(i) + 2);
    h.link = VethName(k, i);
    hosts->hosts_.push_back(h);
    for (const std::vector<std::string>& cmd : std::vector<std::vector<std::string>>{
             {"netns", "add", h.netns},
             {"link", "add", h.link, "type", "veth", "peer", "name", "eth0", "netns", h.netns},
             {"link", "set", h.link, "master", hosts->bridge_, "up"},
             {"-n", h.netns, "addr", "add", h.address + "/24", "dev", "eth0"},
             {"-n", h.netns, "link", "set", "eth0", "up"},
             {"-n", h.netns, "link", "set", "lo", "up"}}) {
      st = Ip(cmd);
      if (!st.ok()) return fail(st);
    }
  }
  for (const NetHost& h : hosts->hosts_) {
    st = WaitLinkUp(h.link);
    if (!st.ok()) return fail(st);
  }
  return hosts;
}

Status NetHosts::SetLinkUp(size_t i, bool up) {
  if (i >= hosts_.size()) {
    return OutOfRange("NetHosts: no host ", i, " (have ", hosts_.size(), ")");
  }
  TESSERA_RETURN_IF_ERROR(Ip({"link", "set", hosts_[i].link, up ? "up" : "down"}));
  return up ? WaitLinkUp(hosts_[i].link) : Status::Ok();
}

void NetHosts::Destroy() {
  if (subnet_ < 0) return;
  RemoveSubnet(subnet_);
  subnet_ = -1;
}

NetHosts::~NetHosts() { Destroy(); }

}  // namespace tessera::client
