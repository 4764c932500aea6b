// A small pipelined memcached client (binary protocol) for `tessera bench fabric`, as lean as
// the Tessera TCP transport on the fast path: requests are appended to a per-connection output
// buffer and leave with one send() per connection per batch; responses are parsed in place from
// one input buffer; no allocation per request once buffers have grown.
//
// Not thread-safe; one instance per benchmark thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/fd.h"
#include "common/status.h"

namespace tessera::bench {

class MemcachedClient {
 public:
  enum class Op : uint8_t { kGet = 0x00, kSet = 0x01 };
  struct Reply {
    uint32_t opaque;  // As given to Queue().
    bool ok;          // Status 0 (and for GET, a value of the expected length).
  };

  // Connects to every endpoint (an IPv4 address and a port), retrying until `deadline`
  // (memcached may still be starting).
  Status Connect(const std::vector<std::pair<std::string, uint16_t>>& endpoints, Deadline deadline);

  // Appends a GET/SET of key `key_index` (value `value` for SET) to connection `conn`'s batch.
  void Queue(int conn, Op op, uint32_t size, uint32_t key_index, const uint8_t* value,
             uint32_t opaque);
  // Sends every queued batch (one send() per connection with data).
  Status Flush();
  // Receives without blocking and appends finished replies to `out`.
  Status Poll(std::vector<Reply>* out);
  // Bytes of the last GET value per opaque are not kept; GET values are checked for length
  // only, and copied into `sink` (so the client pays the same copy the Tessera client pays).
  void set_sink(uint8_t* sink, uint32_t size) {
    sink_ = sink;
    sink_size_ = size;
  }
  int connections() const { return static_cast<int>(conns_.size()); }

 private:
  struct Conn {
    UniqueFd fd;
    std::vector<uint8_t> out;
    size_t out_off = 0;
    std::vector<uint8_t> in;
    size_t in_start = 0;
    size_t in_end = 0;
    uint32_t outstanding = 0;
  };
  Status ParseReplies(Conn& c, std::vector<Reply>* out);
  std::vector<Conn> conns_;
  UniqueFd epoll_;
  uint8_t* sink_ = nullptr;
  uint32_t sink_size_ = 0;
};

// Key text for (size, index): fixed length so request sizes do not vary.
std::string MemcachedKey(uint32_t size, uint32_t index);

}  // namespace tessera::bench
