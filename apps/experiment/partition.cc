#include "apps/experiment/partition.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "apps/experiment/tools.h"
#include "common/clock.h"

namespace tessera::experiment {
namespace {

constexpr const char* kPrefix = "tessera_exp_";
constexpr int kLockWaitMs = 30000;

}  // namespace

Partition::Partition(std::string lock_path)
    : lock_path_(std::move(lock_path)), table_(kPrefix + std::to_string(getpid())) {}

Partition::~Partition() { HealAll(); }

bool Partition::TableExists(const std::string& table) {
  auto r = RunTool({"nft", "list", "table", "inet", table}, 5000);
  return r.ok() && r->exit_code == 0;
}

Status Partition::Available() {
  if (available_ >= 0) {
    return available_ == 1 ? Status::Ok() : Unsupported(unavailable_reason_);
  }
  available_ = 0;
  auto list = RunTool({"nft", "list", "tables"}, 5000);
  if (!list.ok() || list->exit_code != 0) {
    unavailable_reason_ = "nftables cannot be used here (`nft list tables`: " +
                          (list.ok() ? list->output : list.status().ToString()) + ")";
    return Unsupported(unavailable_reason_);
  }
  // Remove tables left by runners that died (SIGKILL) while a partition was in place.
  std::istringstream in(list->output);
  std::string word, family, name;
  while (in >> word >> family >> name) {
    if (word != "table" || name.rfind(kPrefix, 0) != 0) continue;
    long pid = std::atol(name.c_str() + std::string(kPrefix).size());
    if (pid > 0 && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      RunTool({"nft", "delete", "table", family, name}, 5000).status().IgnoreError();
    }
  }
  // Probe: create and delete our table once.
  auto add = RunTool({"nft", "add", "table", "inet", table_}, 5000);
  if (!add.ok() || add->exit_code != 0) {
    unavailable_reason_ = "nftables refused a table (`nft add table`: " +
                          (add.ok() ? add->output : add.status().ToString()) + ")";
    return Unsupported(unavailable_reason_);
  }
  RunTool({"nft", "delete", "table", "inet", table_}, 5000).status().IgnoreError();
  available_ = 1;
  return Status::Ok();
}

Status Partition::Prepare(int wait_ms) {
  TESSERA_RETURN_IF_ERROR(Available());
  TESSERA_RETURN_IF_ERROR(Lock(wait_ms));
  keep_lock_ = true;
  return Status::Ok();
}

Status Partition::Lock(int wait_ms) {
  if (lock_fd_.valid() || lock_path_.empty()) return Status::Ok();  // Empty: no lock asked for.
  UniqueFd fd(::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666));
  if (!fd.valid()) return ErrnoError("open ", lock_path_);
  Deadline deadline = Deadline::AfterMs(static_cast<uint64_t>(wait_ms));
  while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) return ErrnoError("flock ", lock_path_);
    if (deadline.Expired()) {
      return Timeout("another tool held ", lock_path_, " for ", wait_ms / 1000.0, " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // polling a held lock
  }
  lock_fd_ = std::move(fd);
  return Status::Ok();
}

Status Partition::Rebuild() {
  std::string script;
  if (table_exists_) script += "delete table inet " + table_ + "\n";
  if (!ports_.empty()) {
    script += "table inet " + table_ +
              " {\n  chain out {\n    type filter hook output priority 0; "
              "policy accept;\n";
    for (int p : ports_) {
      script += "    tcp dport " + std::to_string(p) + " drop\n";
      script += "    tcp sport " + std::to_string(p) + " drop\n";
    }
    script += "  }\n}\n";
  }
  if (script.empty()) return Status::Ok();
  char path[] = "/tmp/tessera-nft-XXXXXX";
  int fd = ::mkstemp(path);
  if (fd < 0) return ErrnoError("mkstemp");
  bool wrote = ::write(fd, script.data(), script.size()) == static_cast<ssize_t>(script.size());
  ::close(fd);
  if (!wrote) {
    ::unlink(path);
    return IoError("writing the nft script ", path);
  }
  auto r = RunTool({"nft", "-f", path}, 5000);
  ::unlink(path);
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) return Internal("nft -f: ", r->output);
  table_exists_ = !ports_.empty();
  return Status::Ok();
}

Status Partition::Cut(int port) {
  TESSERA_RETURN_IF_ERROR(Available());
  TESSERA_RETURN_IF_ERROR(Lock(kLockWaitMs));
  ports_.insert(port);
  Status st = Rebuild();
  if (!st.ok()) {
    ports_.erase(port);
    if (ports_.empty() && !table_exists_ && !keep_lock_) lock_fd_.Reset();
  }
  return st;
}

Status Partition::Heal(int port) {
  if (ports_.erase(port) == 0) return Status::Ok();
  Status st = Rebuild();
  if (!table_exists_ && !keep_lock_) lock_fd_.Reset();
  return st;
}

void Partition::HealAll() {
  ports_.clear();
  if (table_exists_) {
    auto r = RunTool({"nft", "delete", "table", "inet", table_}, 5000);
    if (!r.ok() || r->exit_code != 0) {
      std::fprintf(stderr, "tessera experiment: could not remove nftables table %s: %s\n",
                   table_.c_str(), r.ok() ? r->output.c_str() : r.status().ToString().c_str());
    } else {
      table_exists_ = false;
    }
  }
  if (!table_exists_) {
    lock_fd_.Reset();
    keep_lock_ = false;
  }
}

}  // namespace tessera::experiment
