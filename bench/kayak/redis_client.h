// A lean pipelined Redis client for `tessera bench kayak`: one TCP connection, RESP2 commands
// sent by the caller's thread (under a mutex), replies parsed by one reader thread and handed
// to the callbacks in order (Redis answers a connection's commands in order). It is built the
// same way as kayak::Connection, so neither side of the comparison has a heavier client: the
// commands the callbacks of one recv()'s replies send are written with one send() when those
// callbacks are done (kayak::Connection's SendBatch), others at once.
//
// Threads: Send() from any thread; callbacks on the reader thread.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/fd.h"
#include "common/status.h"

namespace kayak::bench {

struct RedisReply {
  enum Kind { kString, kNil, kInteger, kStatus, kError, kArray } kind = kNil;
  std::string str;      // kString, kStatus, kError
  long long integer = 0;
};

class RedisClient {
 public:
  static tessera::Result<std::unique_ptr<RedisClient>> Connect(const std::string& host, int port);
  ~RedisClient();
  using Callback = std::function<void(tessera::Result<RedisReply>)>;
  void Send(const std::vector<std::string>& args, Callback cb);
  tessera::Result<RedisReply> Call(const std::vector<std::string>& args);

 private:
  RedisClient() = default;
  void ReaderMain();
  tessera::UniqueFd fd_;
  void FlushLocked();  // Writes out_ (under mu_).
  std::mutex mu_;
  std::string out_;  // Commands not yet written; under mu_.
  bool batching_ = false;  // The reader is running one recv()'s callbacks; under mu_.
  std::thread::id reader_id_;
  std::deque<Callback> pending_;
  bool down_ = false;
  std::thread reader_;
};

}  // namespace kayak::bench
