// IoRing: the probed io_uring set-up (see fabric/io_ring.h).
#include "fabric/io_ring.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>

namespace tessera::fabric {
namespace {

constexpr unsigned kFastFlags =
    IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_R_DISABLED;

unsigned FlagsFor(IoRingMode mode) {
  return mode == IoRingMode::kSingleIssuerDeferred ? kFastFlags : 0;
}

Status QueueInit(uint32_t entries, io_uring* ring, IoRingMode mode) {
  io_uring_params params{};
  params.flags = FlagsFor(mode);
  int rc = io_uring_queue_init_params(entries, ring, &params);
  if (rc < 0) {
    errno = -rc;
    return ErrnoError("io_uring_queue_init(", entries, ", ", IoRingModeName(mode), ")");
  }
  return Status::Ok();
}

}  // namespace

std::string_view IoRingModeName(IoRingMode mode) {
  return mode == IoRingMode::kSingleIssuerDeferred ? "single-issuer-deferred" : "plain";
}

Result<IoRingMode> ProbeIoRing() {
  static std::once_flag once;
  static Result<IoRingMode> probed = IoRingMode::kPlain;
  std::call_once(once, [] {
    for (IoRingMode mode : {IoRingMode::kSingleIssuerDeferred, IoRingMode::kPlain}) {
      io_uring ring{};
      Status st = QueueInit(4, &ring, mode);
      if (st.ok()) {
        io_uring_queue_exit(&ring);
        probed = mode;
        return;
      }
      probed = st;
    }
  });
  return probed;
}

IoRing::~IoRing() {
  if (ready_) io_uring_queue_exit(&ring_);
}

Status IoRing::Init(uint32_t entries) {
  if (ready_) return InvalidArgument("IoRing::Init called twice");
  TESSERA_ASSIGN_OR_RETURN(mode_, ProbeIoRing());
  TESSERA_RETURN_IF_ERROR(QueueInit(entries, &ring_, mode_));
  ready_ = true;
  enabled_ = mode_ == IoRingMode::kPlain;
  return Status::Ok();
}

Status IoRing::EnableOnThisThread() {
  if (!ready_) return InvalidArgument("IoRing::EnableOnThisThread before Init");
  if (enabled_) return Status::Ok();
  // io_uring_enable_rings() is declared but not exported by liburing 2.3: register directly.
  if (::syscall(__NR_io_uring_register, ring_.ring_fd, IORING_REGISTER_ENABLE_RINGS, nullptr, 0) <
      0) {
    return ErrnoError("io_uring_register(ENABLE_RINGS)");
  }
  enabled_ = true;
  return Status::Ok();
}

io_uring_sqe* IoRing::Sqe() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  while (sqe == nullptr) {
    io_uring_submit(&ring_);
    sqe = io_uring_get_sqe(&ring_);
  }
  return sqe;
}

void IoRing::SubmitAndWait(uint64_t timeout_ns) {
  __kernel_timespec ts{static_cast<int64_t>(timeout_ns / 1000000000ull),
                       static_cast<int64_t>(timeout_ns % 1000000000ull)};
  io_uring_cqe* cqe = nullptr;
  io_uring_submit_and_wait_timeout(&ring_, &cqe, 1, &ts, nullptr);
}

}  // namespace tessera::fabric
