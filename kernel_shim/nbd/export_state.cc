// The export's state file (see kernel_shim/nbd/export_state.h).
#include "kernel_shim/nbd/export_state.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <sstream>
#include <string_view>

namespace tessera::nbd {
namespace {

constexpr std::string_view kMagic = "tessera-nbd-state v1";
constexpr size_t kMaxStateBytes = 4096;

// The directory holding `path` ("." for a bare name).
std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

Status SyncDir(const std::string& dir) {
  UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d) return ErrnoError("open directory ", dir);
  if (::fsync(d.get()) != 0) return ErrnoError("fsync directory ", dir);
  return Status::Ok();
}

// Parses the file: the `written` value, or Corruption.
Result<bool> ParseState(std::string_view text, const std::string& path) {
  std::istringstream in{std::string(text)};
  std::string line;
  bool magic = false;
  int written = -1;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (!magic) {
      if (line != kMagic) break;
      magic = true;
      continue;
    }
    if (line == "written 0")
      written = 0;
    else if (line == "written 1")
      written = 1;
  }
  if (!magic || written < 0) {
    return Corruption(path, " is not a tessera nbd state file (no '", kMagic,
                      "' line followed by 'written 0|1'); refusing to serve over it. If it "
                      "is a state file torn by a crash, the export it belonged to may have "
                      "acknowledged writes; delete it only to start over with an empty device");
  }
  return written == 1;
}

}  // namespace

Result<std::unique_ptr<ExportStateFile>> ExportStateFile::Open(const std::string& path) {
  if (path.empty()) return InvalidArgument("the export state file path is empty");
  bool created = false;
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_CREAT | O_EXCL, 0644);
  if (fd >= 0) {
    created = true;
  } else if (errno == EEXIST) {
    fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  }
  if (fd < 0) return ErrnoError("open export state file ", path);
  UniqueFd f(fd);
  struct stat st {};
  if (::fstat(f.get(), &st) != 0) return ErrnoError("fstat ", path);
  if (!S_ISREG(st.st_mode)) return InvalidArgument(path, " is not a regular file");
  if (::flock(f.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return Unavailable(path, " is in use by another running tessera nbd (it holds its lock)");
    }
    return ErrnoError("flock ", path);
  }
  if (created) TESSERA_RETURN_IF_ERROR(SyncDir(DirOf(path)));
  if (st.st_size > static_cast<off_t>(kMaxStateBytes)) {
    return Corruption(path, " is ", st.st_size, " bytes: not a tessera nbd state file");
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    ssize_t n = ::pread(f.get(), text.data() + got, text.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("read ", path);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  if (!text.empty()) {
    TESSERA_ASSIGN_OR_RETURN(bool written, ParseState(text, path));
    if (written) {
      return DataLoss(path,
                      " records that a previous run of this export accepted writes. Its page map "
                      "(where each block's splits are and their checksums) lived only in that "
                      "process, so those blocks cannot be read back, and serving the device now "
                      "would return zeros for them. Refusing to start. To start over with an empty "
                      "device (all previous contents lost), delete ",
                      path, " and start again");
    }
  }
  std::unique_ptr<ExportStateFile> s(new ExportStateFile(path, std::move(f)));
  TESSERA_RETURN_IF_ERROR(s->Store(false));
  return s;
}

Status ExportStateFile::Store(bool written) {
  std::ostringstream o;
  o << "# tessera nbd export state; delete this file only to start over with an empty device\n"
    << kMagic << "\n"
    << "written " << (written ? 1 : 0) << "\n"
    << "pid " << ::getpid() << "\n"
    << "since " << static_cast<long long>(::time(nullptr)) << "\n";
  const std::string text = o.str();
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n =
        ::pwrite(lock_fd_.get(), text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("write ", path_);
    done += static_cast<size_t>(n);
  }
  if (::ftruncate(lock_fd_.get(), static_cast<off_t>(text.size())) != 0) {
    return ErrnoError("ftruncate ", path_);
  }
  if (::fdatasync(lock_fd_.get()) != 0) return ErrnoError("fdatasync ", path_);
  return Status::Ok();
}

Status ExportStateFile::RecordWritten() {
  if (written_.load(std::memory_order_acquire)) return Status::Ok();
  std::lock_guard<std::mutex> lock(mu_);
  if (written_.load(std::memory_order_relaxed)) return Status::Ok();
  Status st = Store(true);
  if (!st.ok()) return st.WithContext("recording the first write in the export state file");
  written_.store(true, std::memory_order_release);
  return Status::Ok();
}

}  // namespace tessera::nbd
