// The reply sender of one NBD connection (see kernel_shim/nbd/reply_sender.h).
#include "kernel_shim/nbd/reply_sender.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <vector>

#include "kernel_shim/nbd/socket_io.h"

namespace tessera::nbd {

void ReplySender::FailLocked() {
  failed_ = true;
  outbox_.clear();
  outbox_bytes_.store(0);
  flushing_ = false;
  ::shutdown(fd_, SHUT_RDWR);  // Also stops the reader...
  wake_reader_();              // ... if it waits for room.
}

ReplySender::Outcome ReplySender::SendOrQueue(struct iovec* iov, size_t count) {
  size_t total = 0;
  for (size_t i = 0; i < count; ++i) total += iov[i].iov_len;
  std::lock_guard<std::mutex> lk(mu_);
  if (failed_) return Outcome::kDone;
  size_t sent = 0;
  if (!flushing_) {
    while (sent < total) {
      // Skip what was sent already.
      size_t skip = sent, i = 0;
      while (i < count && skip >= iov[i].iov_len) skip -= iov[i++].iov_len;
      std::vector<struct iovec> rest(iov + i, iov + count);
      rest[0].iov_base = static_cast<uint8_t*>(rest[0].iov_base) + skip;
      rest[0].iov_len -= skip;
      msghdr msg{};
      msg.msg_iov = rest.data();
      msg.msg_iovlen = std::min<size_t>(rest.size(), IOV_MAX);
      ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      FailLocked();
      return Outcome::kDone;
    }
    if (sent == total) return Outcome::kDone;
  }
  // Queue what is left, in order.
  std::string rest;
  rest.reserve(total - sent);
  size_t skip = sent;
  for (size_t i = 0; i < count; ++i) {
    const auto* b = static_cast<const char*>(iov[i].iov_base);
    if (skip >= iov[i].iov_len) {
      skip -= iov[i].iov_len;
      continue;
    }
    rest.append(b + skip, iov[i].iov_len - skip);
    skip = 0;
  }
  outbox_bytes_.fetch_add(rest.size(), std::memory_order_relaxed);
  outbox_.push_back(std::move(rest));
  if (flushing_) return Outcome::kDone;
  flushing_ = true;
  return Outcome::kDrainNeeded;
}

void ReplySender::Drain() {
  for (;;) {
    std::string chunk;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (outbox_.empty() || failed_) {
        outbox_.clear();
        outbox_bytes_.store(0);
        flushing_ = false;
        return;
      }
      chunk = std::move(outbox_.front());
      outbox_.pop_front();
    }
    outbox_bytes_.fetch_sub(chunk.size(), std::memory_order_relaxed);
    wake_reader_();
    if (!WriteString(fd_, chunk)) {  // Blocking; only this thread writes meanwhile.
      std::lock_guard<std::mutex> lk(mu_);
      FailLocked();
      return;
    }
  }
}

}  // namespace tessera::nbd
