#define FUSE_USE_VERSION 312
#include "kernel_shim/swap/swap_file_server.h"

#include <fuse3/fuse_lowlevel.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>

#include "common/logging.h"

namespace tessera::kernel_shim {
namespace {

constexpr fuse_ino_t kRootIno = FUSE_ROOT_ID;
constexpr fuse_ino_t kFileIno = 2;
constexpr size_t kPage = client::kPageSize;

// Whether `path` is already a mount point (a line of /proc/self/mountinfo names it).
bool IsMountPoint(const std::string& path) {
  std::ifstream in("/proc/self/mountinfo");
  for (std::string line; std::getline(in, line);) {
    // Fields: id parent major:minor root mountpoint ...
    size_t pos = 0;
    for (int field = 0; field < 4 && pos != std::string::npos; ++field) {
      pos = line.find(' ', pos);
      if (pos != std::string::npos) ++pos;
    }
    if (pos == std::string::npos) continue;
    const size_t end = line.find(' ', pos);
    if (line.compare(pos, end - pos, path) == 0) return true;
  }
  return false;
}

}  // namespace

// One worker thread's buffers: allocated when the thread serves its first request, reused for
// every later one (no allocation per request).
struct Scratch {
  uint8_t* buf = nullptr;  // max_io_bytes + 2 pages, page-aligned.
  client::PageOp* ops = nullptr;
  size_t max_pages = 0;
  ~Scratch() {
    std::free(buf);
    delete[] ops;
  }
};

struct SwapFileServer::Impl {
  client::PageStore* store = nullptr;
  SwapFileOptions options;
  uint64_t pages = 0;
  fuse_session* session = nullptr;
  bool mounted = false;
  std::mutex partial_mu;  // Serialises read-modify-write of partly covered pages.

  std::atomic<uint64_t> read_requests{0}, write_requests{0}, pages_read{0}, pages_written{0},
      partial_page_ops{0}, read_errors{0}, write_errors{0}, lost_pages{0}, flushes{0};
  std::atomic<uint64_t> lost_ring[kLostPagesKept] = {};
  std::atomic<uint64_t> lost_next{0};

  Scratch* ThreadScratch() {
    thread_local Scratch scratch;
    if (scratch.buf == nullptr) {
      scratch.max_pages = options.max_io_bytes / kPage + 2;
      scratch.buf = static_cast<uint8_t*>(std::aligned_alloc(kPage, scratch.max_pages * kPage));
      scratch.ops = new client::PageOp[scratch.max_pages];
    }
    return &scratch;
  }

  // Reads or writes `count` consecutive pages from `first` over `buf` (count <= max_pages).
  // Returns 0 or the errno to answer; lost pages are recorded.
  int Transfer(client::PageOp::Kind kind, client::PageId first, size_t count, uint8_t* buf,
               Scratch* s) {
    if (kind == client::PageOp::Kind::kRead) {
      // Blocking reads: a remote store serves them on this thread (run to completion, no hand-off
      // to a store thread and back). Only when one fails, each page is read again alone to tell
      // which are lost.
      client::PageId ids[(1 << 20) / kPage + 2];
      for (size_t i = 0; i < count; ++i) ids[i] = first + i;
      if (store->ReadPages(ids, count, buf).ok()) return 0;
      int err = 0;
      for (size_t i = 0; i < count; ++i) {
        Status os = store->ReadPage(first + i, buf + i * kPage);
        if (os.ok()) continue;
        err = EIO;
        NoteReadError(first + i, os);
      }
      return err;
    }
    client::OpWaiter waiter;
    client::PageOp* ops = s->ops;
    for (size_t i = 0; i < count; ++i) {
      ops[i].kind = kind;
      ops[i].page = first + i;
      ops[i].buf = buf + i * kPage;
      ops[i].status = Status::Ok();
    }
    waiter.Arm(ops, count);
    // Pointers to the ops, on the stack (count <= 258 for 1 MiB requests).
    client::PageOp* ptrs[(1 << 20) / kPage + 2];
    for (size_t i = 0; i < count; ++i) ptrs[i] = &ops[i];
    Status st = store->Submit(std::span<client::PageOp* const>(ptrs, count));
    if (!st.ok()) {
      TLOG(WARNING) << "swap file: " << (kind == client::PageOp::Kind::kRead ? "read" : "write")
                    << " of pages " << first << ".." << first + count - 1
                    << " not accepted: " << st;
      return EIO;
    }
    (void)waiter.Wait(ops, count);
    int err = 0;
    for (size_t i = 0; i < count; ++i) {
      const Status& os = ops[i].status;
      if (os.ok()) continue;
      err = EIO;
      TLOG(WARNING) << "swap file: write of page " << ops[i].page << " failed: " << os;
    }
    return err;
  }

  void NoteReadError(client::PageId page, const Status& os) {
    if (os.code() != StatusCode::kDataLoss) {
      TLOG(WARNING) << "swap file: read of page " << page << " failed: " << os;
      return;
    }
    lost_pages.fetch_add(1, std::memory_order_relaxed);
    const uint64_t slot = lost_next.fetch_add(1, std::memory_order_relaxed);
    lost_ring[slot % kLostPagesKept].store(page, std::memory_order_relaxed);
    TLOG(ERROR) << "swap file: page " << page << " (file offset " << page * kPage
                << ") is lost: " << os << "; the process that swaps it in gets SIGBUS";
  }

  void Read(fuse_req_t req, size_t size, off_t off) {
    read_requests.fetch_add(1, std::memory_order_relaxed);
    const uint64_t file_size = pages * kPage;
    if (off < 0) {
      fuse_reply_err(req, EINVAL);
      return;
    }
    if (static_cast<uint64_t>(off) >= file_size || size == 0) {
      fuse_reply_buf(req, nullptr, 0);
      return;
    }
    size = std::min<uint64_t>({size, file_size - off, options.max_io_bytes});
    Scratch* s = ThreadScratch();
    const uint64_t first = static_cast<uint64_t>(off) / kPage;
    const uint64_t last = (static_cast<uint64_t>(off) + size - 1) / kPage;
    const size_t count = last - first + 1;
    const bool partial = off % kPage != 0 || size % kPage != 0;
    if (partial) partial_page_ops.fetch_add(1, std::memory_order_relaxed);
    const int err = Transfer(client::PageOp::Kind::kRead, first, count, s->buf, s);
    if (err != 0) {
      read_errors.fetch_add(1, std::memory_order_relaxed);
      fuse_reply_err(req, err);
      return;
    }
    pages_read.fetch_add(count, std::memory_order_relaxed);
    fuse_reply_buf(req, reinterpret_cast<const char*>(s->buf + off % kPage), size);
  }

  void Write(fuse_req_t req, const char* data, size_t size, off_t off) {
    write_requests.fetch_add(1, std::memory_order_relaxed);
    const uint64_t file_size = pages * kPage;
    if (off < 0 || static_cast<uint64_t>(off) + size > file_size) {
      fuse_reply_err(req, off < 0 ? EINVAL : ENOSPC);
      return;
    }
    if (size == 0) {
      fuse_reply_write(req, 0);
      return;
    }
    if (size > options.max_io_bytes) {
      fuse_reply_err(req, EINVAL);
      return;
    }
    Scratch* s = ThreadScratch();
    const uint64_t first = static_cast<uint64_t>(off) / kPage;
    const uint64_t last = (static_cast<uint64_t>(off) + size - 1) / kPage;
    const size_t count = last - first + 1;
    int err = 0;
    if (off % kPage == 0 && size % kPage == 0) {
      // Whole pages, straight from the request buffer (the store does not modify a write's
      // buffer; PageOp::buf is not const because reads fill it).
      err = Transfer(client::PageOp::Kind::kWrite, first, count,
                     reinterpret_cast<uint8_t*>(const_cast<char*>(data)), s);
    } else {
      partial_page_ops.fetch_add(1, std::memory_order_relaxed);
      std::lock_guard<std::mutex> lock(partial_mu);
      // Read the first and last pages (the ones partly covered), patch, write all.
      err = Transfer(client::PageOp::Kind::kRead, first, 1, s->buf, s);
      if (err == 0 && count > 1) {
        err = Transfer(client::PageOp::Kind::kRead, last, 1, s->buf + (count - 1) * kPage, s);
      }
      if (err == 0) {
        std::memcpy(s->buf + off % kPage, data, size);
        err = Transfer(client::PageOp::Kind::kWrite, first, count, s->buf, s);
      }
    }
    if (err != 0) {
      write_errors.fetch_add(1, std::memory_order_relaxed);
      fuse_reply_err(req, err);
      return;
    }
    pages_written.fetch_add(count, std::memory_order_relaxed);
    fuse_reply_write(req, size);
  }

  void FillAttr(fuse_ino_t ino, struct stat* st) const {
    std::memset(st, 0, sizeof(*st));
    st->st_ino = ino;
    st->st_uid = ::geteuid();
    st->st_gid = ::getegid();
    if (ino == kRootIno) {
      st->st_mode = S_IFDIR | 0755;
      st->st_nlink = 2;
    } else {
      st->st_mode = S_IFREG | 0600;
      st->st_nlink = 1;
      st->st_size = static_cast<off_t>(pages * kPage);
      st->st_blksize = kPage;
      st->st_blocks = static_cast<blkcnt_t>(pages * (kPage / 512));
    }
  }
};

namespace {

SwapFileServer::Impl* ImplOf(fuse_req_t req) {
  return static_cast<SwapFileServer::Impl*>(fuse_req_userdata(req));
}

void OpInit(void* userdata, fuse_conn_info* conn) {
  auto* impl = static_cast<SwapFileServer::Impl*>(userdata);
  conn->max_write = impl->options.max_io_bytes;
  conn->max_readahead = 0;
  // Page-sized copies from and to the request buffer; splice would only add pipe round trips.
  conn->want &= ~(FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE);
  // A large direct I/O may be split into requests served in parallel.
  if (conn->capable & FUSE_CAP_ASYNC_DIO) conn->want |= FUSE_CAP_ASYNC_DIO;
}

void OpLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  auto* impl = ImplOf(req);
  if (parent != kRootIno || impl->options.file_name != name) {
    fuse_reply_err(req, ENOENT);
    return;
  }
  fuse_entry_param e{};
  e.ino = kFileIno;
  e.attr_timeout = 3600;
  e.entry_timeout = 3600;
  impl->FillAttr(kFileIno, &e.attr);
  fuse_reply_entry(req, &e);
}

void OpGetattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  if (ino != kRootIno && ino != kFileIno) {
    fuse_reply_err(req, ENOENT);
    return;
  }
  struct stat st;
  ImplOf(req)->FillAttr(ino, &st);
  fuse_reply_attr(req, &st, 3600);
}

void OpSetattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info*) {
  auto* impl = ImplOf(req);
  // The file's size is fixed: truncating it would drop swap slots the kernel owns.
  if ((to_set & FUSE_SET_ATTR_SIZE) &&
      static_cast<uint64_t>(attr->st_size) != impl->pages * kPage) {
    fuse_reply_err(req, EPERM);
    return;
  }
  struct stat st;
  impl->FillAttr(ino, &st);
  fuse_reply_attr(req, &st, 3600);
}

// The kernel's reply to OPEN (struct fuse_open_out of <linux/fuse.h>) and its flags. libfuse
// 3.14 (Debian's) cannot express FOPEN_PARALLEL_DIRECT_WRITES (kernel 6.2+; libfuse 3.15+), so
// the reply is built here and sent as is: without it the kernel serialises every write to the
// one file on its inode lock, and swap-outs queue behind each other.
struct OpenOut {
  uint64_t fh;
  uint32_t open_flags;
  uint32_t padding;
};
constexpr uint32_t kFopenDirectIo = 1u << 0;  // No page cache.
constexpr uint32_t kFopenNoflush = 1u << 5;   // No FLUSH on close.
constexpr uint32_t kFopenParallelDirectWrites = 1u << 6;

void OpOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (ino != kFileIno) {
    fuse_reply_err(req, EISDIR);
    return;
  }
  OpenOut out{};
  out.fh = fi->fh;
  out.open_flags = kFopenDirectIo | kFopenNoflush | kFopenParallelDirectWrites;
  fuse_reply_buf(req, reinterpret_cast<const char*>(&out), sizeof out);
}

void OpRead(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  if (ino != kFileIno) {
    fuse_reply_err(req, EISDIR);
    return;
  }
  ImplOf(req)->Read(req, size, off);
}

void OpWrite(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off,
             fuse_file_info*) {
  if (ino != kFileIno) {
    fuse_reply_err(req, EISDIR);
    return;
  }
  ImplOf(req)->Write(req, buf, size, off);
}

void OpFsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info*) {
  auto* impl = ImplOf(req);
  impl->flushes.fetch_add(1, std::memory_order_relaxed);
  Status st = impl->store->Flush();
  if (!st.ok()) TLOG(WARNING) << "swap file: fsync: " << st;
  fuse_reply_err(req, st.ok() ? 0 : EIO);
}

void OpFlush(fuse_req_t req, fuse_ino_t, fuse_file_info*) { fuse_reply_err(req, 0); }

void OpReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  if (ino != kRootIno) {
    fuse_reply_err(req, ENOTDIR);
    return;
  }
  auto* impl = ImplOf(req);
  char buf[512];
  size_t used = 0;
  struct Entry {
    const char* name;
    fuse_ino_t ino;
  } entries[] = {{".", kRootIno}, {"..", kRootIno}, {impl->options.file_name.c_str(), kFileIno}};
  for (off_t i = off; i < 3; ++i) {
    struct stat st {};
    st.st_ino = entries[i].ino;
    st.st_mode = entries[i].ino == kRootIno ? S_IFDIR : S_IFREG;
    const size_t need = fuse_add_direntry(req, buf + used, std::min(size, sizeof buf) - used,
                                          entries[i].name, &st, i + 1);
    if (used + need > std::min(size, sizeof buf)) break;
    used += need;
  }
  fuse_reply_buf(req, buf, used);
}

const fuse_lowlevel_ops kOps = [] {
  fuse_lowlevel_ops ops{};
  ops.init = OpInit;
  ops.lookup = OpLookup;
  ops.getattr = OpGetattr;
  ops.setattr = OpSetattr;
  ops.open = OpOpen;
  ops.read = OpRead;
  ops.write = OpWrite;
  ops.fsync = OpFsync;
  ops.flush = OpFlush;
  ops.readdir = OpReaddir;
  return ops;
}();

}  // namespace

Result<std::unique_ptr<SwapFileServer>> SwapFileServer::Create(client::PageStore* store,
                                                               const SwapFileOptions& options) {
  if (store == nullptr) return InvalidArgument("swap file: no page store");
  if (options.mountpoint.empty()) return InvalidArgument("swap file: no mount point");
  if (options.file_name.empty() || options.file_name.find('/') != std::string::npos) {
    return InvalidArgument("swap file: bad file name '", options.file_name, "'");
  }
  if (options.size_bytes == 0 || options.size_bytes % kPage != 0) {
    return InvalidArgument("swap file: size must be a positive multiple of 4096, got ",
                           options.size_bytes);
  }
  if (options.size_bytes / kPage > store->capacity_pages()) {
    return InvalidArgument("swap file: size ", options.size_bytes, " exceeds the store's ",
                           store->capacity_pages() * kPage, " bytes");
  }
  if (options.threads < 1 || options.threads > 64) {
    return InvalidArgument("swap file: threads must be in 1..64");
  }
  if (options.max_io_bytes < kPage || options.max_io_bytes > (1u << 20) ||
      options.max_io_bytes % kPage != 0) {
    return InvalidArgument("swap file: max_io_bytes must be a multiple of 4096 in [4K, 1M]");
  }
  std::unique_ptr<SwapFileServer> s(new SwapFileServer());
  s->options_ = options;
  s->impl_ = std::make_unique<Impl>();
  s->impl_->store = store;
  s->impl_->options = options;
  s->impl_->pages = options.size_bytes / kPage;
  return s;
}

SwapFileServer::~SwapFileServer() {
  if (impl_ && impl_->session) {
    if (impl_->mounted) fuse_session_unmount(impl_->session);
    fuse_session_destroy(impl_->session);
  }
}

Status SwapFileServer::Mount() {
  if (impl_->session) return InvalidArgument("swap file: already mounted");
  if (::access("/dev/fuse", R_OK | W_OK) != 0) {
    return Unavailable("/dev/fuse is not available (", std::strerror(errno),
                       "): this kernel has no FUSE, or this user may not use it");
  }
  struct stat st;
  if (::stat(options_.mountpoint.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return InvalidArgument("swap file: mount point ", options_.mountpoint,
                           " is not an existing directory");
  }
  if (IsMountPoint(options_.mountpoint)) {
    return Unavailable("swap file: ", options_.mountpoint,
                       " is already a mount point (another swap device or file system is "
                       "mounted there)");
  }
  const std::string fsname = "-ofsname=" + options_.fsname + ",subtype=tessera";
  // allow_other: swapon and losetup may run as another user than the daemon (both are root
  // here, but the file is the kernel's, not the daemon user's).
  const char* argv[] = {"tessera-swap", fsname.c_str(), "-oallow_other", nullptr};
  fuse_args args = FUSE_ARGS_INIT(3, const_cast<char**>(argv));
  impl_->session = fuse_session_new(&args, &kOps, sizeof(kOps), impl_.get());
  fuse_opt_free_args(&args);
  if (impl_->session == nullptr) return Internal("swap file: fuse_session_new failed");
  if (fuse_session_mount(impl_->session, options_.mountpoint.c_str()) != 0) {
    return Unavailable("swap file: mounting FUSE on ", options_.mountpoint,
                       " failed (root is needed; see the log above)");
  }
  impl_->mounted = true;
  return Status::Ok();
}

Status SwapFileServer::Run() {
  if (!impl_->session) return InvalidArgument("swap file: not mounted");
  fuse_loop_config* cfg = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(cfg, static_cast<unsigned>(options_.threads));
  // Keep every worker (and its scratch buffer) alive between bursts.
  fuse_loop_cfg_set_idle_threads(cfg, static_cast<unsigned>(options_.threads));
  fuse_loop_cfg_set_clone_fd(cfg, 1);
  const int rc = fuse_session_loop_mt(impl_->session, cfg);
  fuse_loop_cfg_destroy(cfg);
  fuse_session_unmount(impl_->session);
  impl_->mounted = false;
  if (rc < 0) return IoError("swap file: FUSE loop: ", std::strerror(-rc));
  return Status::Ok();
}

void SwapFileServer::Exit() {
  if (!impl_ || !impl_->session) return;
  fuse_session_exit(impl_->session);
  // The loop's threads sleep in read(/dev/fuse) until a request comes; a lazy unmount ends the
  // connection once nothing holds the file open, and wakes them (ENODEV).
  ::umount2(options_.mountpoint.c_str(), MNT_DETACH);
}

SwapFileStats SwapFileServer::Stats() const {
  SwapFileStats s;
  const Impl& i = *impl_;
  s.read_requests = i.read_requests.load(std::memory_order_relaxed);
  s.write_requests = i.write_requests.load(std::memory_order_relaxed);
  s.pages_read = i.pages_read.load(std::memory_order_relaxed);
  s.pages_written = i.pages_written.load(std::memory_order_relaxed);
  s.partial_page_ops = i.partial_page_ops.load(std::memory_order_relaxed);
  s.read_errors = i.read_errors.load(std::memory_order_relaxed);
  s.write_errors = i.write_errors.load(std::memory_order_relaxed);
  s.lost_pages = i.lost_pages.load(std::memory_order_relaxed);
  s.flushes = i.flushes.load(std::memory_order_relaxed);
  return s;
}

std::vector<client::PageId> SwapFileServer::LostPages() const {
  const uint64_t next = impl_->lost_next.load(std::memory_order_relaxed);
  std::vector<client::PageId> out;
  const uint64_t begin = next > kLostPagesKept ? next - kLostPagesKept : 0;
  for (uint64_t i = begin; i < next; ++i) {
    out.push_back(impl_->lost_ring[i % kLostPagesKept].load(std::memory_order_relaxed));
  }
  return out;
}

}  // namespace tessera::kernel_shim
