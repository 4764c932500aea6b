#include "client/local_ssd_store.h"

#include <fcntl.h>
#include <liburing.h>
#include <linux/falloc.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <boost/lockfree/queue.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/fd.h"
#include "common/logging.h"

namespace tessera::client {
namespace {

constexpr uint64_t kEventTag = 0;  // user_data of the eventfd read; slots use their address.
constexpr uint32_t kMaxQueueDepth = 4096;

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<uint8_t, FreeDeleter>;

AlignedBuffer AllocAligned(size_t bytes) {
  return AlignedBuffer(static_cast<uint8_t*>(std::aligned_alloc(kPageSize, bytes)));
}

bool IsAligned(const void* p) { return (reinterpret_cast<uintptr_t>(p) % kPageSize) == 0; }

// One op on the device: the caller's op, its progress and its own aligned bounce buffer.
struct Slot {
  PageOp* op = nullptr;
  uint64_t start_ns = 0;
  uint32_t done_bytes = 0;
  bool use_bounce = false;
  uint8_t* bounce = nullptr;
};

// An op handed over by Submit(), stamped with the time it was submitted.
struct Queued {
  PageOp* op;
  uint64_t submit_ns;
};

struct Completed {
  PageOp* op;
  Status status;
  uint64_t latency_ns;
};

}  // namespace

struct LocalSsdStore::Impl {
  LocalSsdOptions opts;
  UniqueFd fd;
  bool direct = false;
  std::string fallback_reason;
  io_uring ring{};
  bool ring_ready = false;
  UniqueFd event_fd;
  uint64_t event_buf = 0;
  bool event_armed = false;
  boost::lockfree::queue<Queued> queue{1024};
  std::atomic<bool> stop{false};
  std::thread thread;

  AlignedBuffer bounce_mem;
  std::vector<Slot> slots;
  std::vector<Slot*> free_slots;
  std::vector<Completed> completed;
  uint32_t inflight = 0;

  mutable std::mutex stats_mu;
  PageStoreStats stats;

  ~Impl() {
    if (ring_ready) io_uring_queue_exit(&ring);
  }

  void ArmEventfd() {
    io_uring_sqe* sqe = GetSqe();
    io_uring_prep_read(sqe, event_fd.get(), &event_buf, sizeof(event_buf), 0);
    io_uring_sqe_set_data64(sqe, kEventTag);
    event_armed = true;
  }

  io_uring_sqe* GetSqe() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    if (sqe == nullptr) {
      // The ring has queue_depth + 1 entries, so this only happens when many resubmissions were
      // prepared in one pass; hand them to the kernel to make room.
      io_uring_submit(&ring);
      sqe = io_uring_get_sqe(&ring);
    }
    TCHECK(sqe != nullptr) << "io_uring submission queue full";
    return sqe;
  }

  void PrepSlot(Slot* s) {
    PageOp* op = s->op;
    uint8_t* base = s->use_bounce ? s->bounce : op->buf;
    uint32_t off = s->done_bytes;
    uint64_t file_off = op->page * kPageSize + off;
    io_uring_sqe* sqe = GetSqe();
    if (op->kind == PageOp::Kind::kRead) {
      io_uring_prep_read(sqe, fd.get(), base + off, kPageSize - off, file_off);
    } else {
      io_uring_prep_write(sqe, fd.get(), base + off, kPageSize - off, file_off);
    }
    io_uring_sqe_set_data(sqe, s);
  }

  void StartOp(const Queued& q) {
    PageOp* op = q.op;
    if (op->page >= opts.capacity_pages) {
      completed.push_back({op,
                           OutOfRange("page ", op->page, " is outside the local store of ",
                                      opts.capacity_pages, " pages"),
                           0});
      return;
    }
    Slot* s = free_slots.back();
    free_slots.pop_back();
    ++inflight;
    s->op = op;
    s->start_ns = q.submit_ns;
    s->done_bytes = 0;
    s->use_bounce = direct && !IsAligned(op->buf);
    if (s->use_bounce && op->kind == PageOp::Kind::kWrite) {
      std::memcpy(s->bounce, op->buf, kPageSize);
    }
    PrepSlot(s);
  }

  void FinishSlot(Slot* s, Status st) {
    PageOp* op = s->op;
    if (st.ok() && s->use_bounce && op->kind == PageOp::Kind::kRead) {
      std::memcpy(op->buf, s->bounce, kPageSize);
    }
    completed.push_back({op, std::move(st), MonotonicNs() - s->start_ns});
    s->op = nullptr;
    free_slots.push_back(s);
    --inflight;
  }

  void HandleCqe(io_uring_cqe* cqe) {
    uint64_t tag = io_uring_cqe_get_data64(cqe);
    int res = cqe->res;
    if (tag == kEventTag) {
      event_armed = false;
      if (!stop.load(std::memory_order_acquire)) ArmEventfd();
      return;
    }
    Slot* s = reinterpret_cast<Slot*>(tag);
    PageOp* op = s->op;
    const char* what = op->kind == PageOp::Kind::kRead ? "read" : "write";
    if (res == -EAGAIN || res == -EINTR) {
      PrepSlot(s);
      return;
    }
    if (res < 0) {
      FinishSlot(s, IoError(what, " of page ", op->page, " in ", opts.path, ": ",
                            std::strerror(-res), " (errno ", -res, ")"));
      return;
    }
    if (res == 0) {
      FinishSlot(s, IoError(what, " of page ", op->page, " in ", opts.path,
                            " made no progress (file shorter than the store?)"));
      return;
    }
    s->done_bytes += static_cast<uint32_t>(res);
    if (s->done_bytes < kPageSize) {
      PrepSlot(s);  // Short read/write: resubmit the rest.
      return;
    }
    FinishSlot(s, Status::Ok());
  }

  void DeliverCompleted() {
    if (completed.empty()) return;
    {
      std::lock_guard<std::mutex> lock(stats_mu);
      for (const Completed& c : completed) {
        bool read = c.op->kind == PageOp::Kind::kRead;
        if (read) {
          stats.reads++;
        } else {
          stats.writes++;
        }
        if (!c.status.ok()) {
          (read ? stats.read_errors : stats.write_errors)++;
          continue;
        }
        if (read) {
          stats.bytes_received += kPageSize;
          stats.read_latency.Record(c.latency_ns);
        } else {
          stats.bytes_sent += kPageSize;
          stats.write_latency.Record(c.latency_ns);
        }
      }
    }
    for (Completed& c : completed) {
      PageOp* op = c.op;
      op->status = std::move(c.status);
      op->done(op);  // The op may be gone after this.
    }
    completed.clear();
  }

  void Run() {
    ArmEventfd();
    while (true) {
      Queued q;
      while (!free_slots.empty() && queue.pop(q)) StartOp(q);
      DeliverCompleted();  // Out-of-range ops complete without touching the device.
      if (stop.load(std::memory_order_acquire) && inflight == 0 && !event_armed &&
          queue.empty()) {
        break;
      }
      int rc = io_uring_submit_and_wait(&ring, 1);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
        TLOG(FATAL) << "io_uring_submit_and_wait on " << opts.path << ": " << std::strerror(-rc);
      }
      unsigned head;
      unsigned n = 0;
      io_uring_cqe* cqe;
      io_uring_for_each_cqe(&ring, head, cqe) {
        HandleCqe(cqe);
        ++n;
      }
      io_uring_cq_advance(&ring, n);
      DeliverCompleted();
    }
  }
};

LocalSsdStore::LocalSsdStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<LocalSsdStore>> LocalSsdStore::Create(const LocalSsdOptions& options) {
  if (options.path.empty()) return InvalidArgument("local store: empty file path");
  if (options.capacity_pages == 0) return InvalidArgument("local store: capacity_pages is 0");
  if (options.capacity_pages > (uint64_t{1} << 40)) {
    return InvalidArgument("local store: capacity_pages ", options.capacity_pages,
                           " is too large (max 2^40 pages)");
  }
  if (options.queue_depth == 0 || options.queue_depth > kMaxQueueDepth) {
    return InvalidArgument("local store: queue_depth must be in 1..", kMaxQueueDepth, ", got ",
                           options.queue_depth);
  }
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  int flags = O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC;
  UniqueFd fd(::open(options.path.c_str(), flags | (options.direct_io ? O_DIRECT : 0), 0600));
  if (!fd && options.direct_io && errno == EINVAL) {
    impl->fallback_reason = "O_DIRECT refused by the file system";
    fd.Reset(::open(options.path.c_str(), flags, 0600));
  }
  if (!fd) return ErrnoError("open ", options.path);
  impl->direct = options.direct_io && impl->fallback_reason.empty();

  const off_t bytes = static_cast<off_t>(options.capacity_pages * kPageSize);
  bool sized = false;
  if (options.preallocate) {
    if (::fallocate(fd.get(), 0, 0, bytes) == 0) {
      sized = true;
    } else if (errno != EOPNOTSUPP) {
      return ErrnoError("fallocate ", bytes, " bytes for ", options.path);
    }
  }
  if (!sized && ::ftruncate(fd.get(), bytes) != 0) {
    return ErrnoError("ftruncate ", options.path, " to ", bytes, " bytes");
  }

  impl->bounce_mem = AllocAligned(size_t{options.queue_depth} * kPageSize);
  if (!impl->bounce_mem) return ResourceExhausted("local store: no memory for bounce buffers");

  if (impl->direct) {
    // Some file systems accept the O_DIRECT flag at open and refuse the I/O; probe once.
    ssize_t got = ::pread(fd.get(), impl->bounce_mem.get(), kPageSize, 0);
    if (got < 0 && errno == EINVAL) {
      int fl = ::fcntl(fd.get(), F_GETFL);
      if (fl < 0 || ::fcntl(fd.get(), F_SETFL, fl & ~O_DIRECT) != 0) {
        return ErrnoError("fcntl clear O_DIRECT on ", options.path);
      }
      impl->direct = false;
      impl->fallback_reason = "O_DIRECT I/O refused by the file system";
    } else if (got < 0) {
      return ErrnoError("pread probe of ", options.path);
    }
  }
  if (!impl->fallback_reason.empty()) {
    TLOG(WARNING) << "local store " << options.path << ": " << impl->fallback_reason
                  << "; using buffered I/O (latencies include the page cache, not the device)";
  }
  impl->fd = std::move(fd);

  impl->event_fd.Reset(::eventfd(0, EFD_CLOEXEC));
  if (!impl->event_fd) return ErrnoError("eventfd");
  int rc = io_uring_queue_init(options.queue_depth + 1, &impl->ring, 0);
  if (rc < 0) {
    errno = -rc;
    return ErrnoError("io_uring_queue_init(", options.queue_depth + 1,
                      ") (io_uring unavailable or locked-memory limit too low?)");
  }
  impl->ring_ready = true;

  impl->slots.resize(options.queue_depth);
  impl->free_slots.reserve(options.queue_depth);
  impl->completed.reserve(size_t{options.queue_depth} + 64);
  for (uint32_t i = 0; i < options.queue_depth; ++i) {
    impl->slots[i].bounce = impl->bounce_mem.get() + size_t{i} * kPageSize;
    impl->free_slots.push_back(&impl->slots[options.queue_depth - 1 - i]);
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Run(); });
  return std::unique_ptr<LocalSsdStore>(new LocalSsdStore(std::move(impl)));
}

LocalSsdStore::~LocalSsdStore() {
  impl_->stop.store(true, std::memory_order_release);
  uint64_t one = 1;
  if (::write(impl_->event_fd.get(), &one, sizeof(one)) != sizeof(one)) {
    TLOG(FATAL) << "local store: eventfd write failed: " << std::strerror(errno);
  }
  impl_->thread.join();
}

std::string LocalSsdStore::name() const {
  if (impl_->direct) return "local-ssd(direct)";
  if (!impl_->opts.direct_io) return "local-ssd(buffered)";
  return "local-ssd(buffered: " + impl_->fallback_reason + ")";
}

uint64_t LocalSsdStore::capacity_pages() const { return impl_->opts.capacity_pages; }
bool LocalSsdStore::direct_io() const { return impl_->direct; }
const std::string& LocalSsdStore::path() const { return impl_->opts.path; }

Status LocalSsdStore::Submit(std::span<PageOp* const> ops) {
  if (impl_->stop.load(std::memory_order_acquire)) {
    return Unavailable("local store ", impl_->opts.path, " is shut down");
  }
  TESSERA_RETURN_IF_ERROR(ValidateBatch(ops));
  if (ops.empty()) return Status::Ok();
  const uint64_t now = MonotonicNs();
  for (PageOp* op : ops) {
    // Unbounded queue: push fails only when node allocation fails.
    TCHECK(impl_->queue.push(Queued{op, now}))
        << "local store: out of memory for the submission queue";
  }
  uint64_t one = 1;
  if (::write(impl_->event_fd.get(), &one, sizeof(one)) != sizeof(one)) {
    // The ops are queued; the I/O thread picks them up with the next wake-up, but an eventfd
    // that cannot be written is a broken invariant.
    TLOG(FATAL) << "local store: eventfd write failed: " << std::strerror(errno);
  }
  return Status::Ok();
}

Status LocalSsdStore::Trim(PageId first, uint64_t count) {
  const uint64_t cap = impl_->opts.capacity_pages;
  if (first >= cap || count > cap - first) {
    return OutOfRange("trim of pages [", first, ", ", first, "+", count,
                      ") is outside the local store of ", cap, " pages");
  }
  if (count == 0) return Status::Ok();
  const off_t off = static_cast<off_t>(first * kPageSize);
  const off_t len = static_cast<off_t>(count * kPageSize);
  if (::fallocate(impl_->fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, len) != 0) {
    if (errno != EOPNOTSUPP) return ErrnoError("fallocate PUNCH_HOLE on ", impl_->opts.path);
    // No hole punching here: write zeros (aligned, so it also works with O_DIRECT).
    constexpr size_t kChunk = 16 * kPageSize;
    AlignedBuffer zeros = AllocAligned(kChunk);
    if (!zeros) return ResourceExhausted("local store: no memory for trim");
    std::memset(zeros.get(), 0, kChunk);
    for (off_t done = 0; done < len;) {
      size_t n = static_cast<size_t>(std::min<off_t>(kChunk, len - done));
      ssize_t w = ::pwrite(impl_->fd.get(), zeros.get(), n, off + done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return ErrnoError("pwrite zeros to ", impl_->opts.path);
      done += w;
    }
  }
  std::lock_guard<std::mutex> lock(impl_->stats_mu);
  impl_->stats.trims += count;
  return Status::Ok();
}

Status LocalSsdStore::Flush() {
  if (::fdatasync(impl_->fd.get()) != 0) return ErrnoError("fdatasync ", impl_->opts.path);
  return Status::Ok();
}

PageStoreStats LocalSsdStore::Stats() const {
  std::lock_guard<std::mutex> lock(impl_->stats_mu);
  return impl_->stats;
}

}  // namespace tessera::client
