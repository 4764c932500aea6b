// Internal to the NBD export: blocking socket I/O of the handshake and the transmission phase,
// the listening sockets, and the per-socket timeouts (like nbdkit's server/socket helpers).
// Every function is reentrant; the fds belong to the caller.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>

#include "common/fd.h"
#include "common/status.h"

namespace tessera::nbd {

// Reads exactly n bytes; false on EOF, error or timeout (SO_RCVTIMEO).
bool ReadFull(int fd, void* buf, size_t n);
// Writes every iovec (adjusting them as it goes); false once the peer is gone.
bool WriteIov(int fd, struct iovec* iov, size_t count);
bool WriteString(int fd, const std::string& s);

// Buffered reading of a stream socket (the transmission phase's requests): one recv() takes
// every request that has arrived, so a burst of pipelined requests costs one system call, and
// whether another request is waiting is known without one. Large reads (WRITE payloads) go
// straight to the caller's buffer. Not thread-safe; does not own the fd.
class BufferedReader {
 public:
  explicit BufferedReader(int fd, size_t capacity = 64 << 10)
      : fd_(fd), buf_(new uint8_t[capacity]), cap_(capacity) {}
  // Reads exactly n bytes (buffered ones first); false on EOF, error or timeout (SO_RCVTIMEO).
  bool ReadFull(void* out, size_t n);
  size_t buffered() const { return len_ - pos_; }
  // True when bytes are buffered or the socket is readable (data, EOF or an error).
  bool Readable() const;

 private:
  const int fd_;
  std::unique_ptr<uint8_t[]> buf_;
  const size_t cap_;
  size_t pos_ = 0, len_ = 0;  // Buffered bytes are buf_[pos_, len_).
};

// SO_RCVTIMEO / SO_SNDTIMEO in milliseconds (0: no timeout).
void SetRecvTimeoutMs(int fd, uint32_t ms);
void SetSendTimeoutMs(int fd, uint32_t ms);
// TCP_NODELAY (fails harmlessly on a unix socket).
void SetNoDelay(int fd);
// "host:port" of a TCP peer, "unix" otherwise.
std::string PeerName(int fd);

// A listening TCP socket on host:port (port 0: ephemeral); *bound gets the port bound.
Result<UniqueFd> ListenTcpSocket(const std::string& host, uint16_t port, uint16_t* bound);
// A listening unix stream socket at `path`.
Result<UniqueFd> ListenUnixSocket(const std::string& path);

}  // namespace tessera::nbd
