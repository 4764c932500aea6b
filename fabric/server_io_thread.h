// Internal to fabric/: ServerIoThread, one I/O thread of the server engine (fabric/server.h).
//
// Each runs one IoRing with: a multishot accept on its own (SO_REUSEPORT) listening socket, one
// FramedConnection per accepted client (one recv always armed, at most one send in flight),
// timeouts for delayed replies and handshake limits, and a read on an eventfd through which
// other threads hand in Commands (notices, disconnects, the stop request). The handshake is
// fabric/handshake.h's ServerHandshake; authenticated requests go to the RequestHandler. A
// connection is freed only once none of its operations is in the kernel.
//
// Ownership: owned by Server::Impl; owns its ring, listening socket, eventfd and connections.
// Threads: Enqueue() from any thread; everything else runs on the thread Start() spawns.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "common/fd.h"
#include "common/logging.h"
#include "fabric/framed_connection.h"
#include "fabric/handshake.h"
#include "fabric/io_ring.h"
#include "fabric/server.h"

namespace tessera::fabric {

// Shared by an I/O thread and every AsyncReply it handed out; `thread` is cleared (under mu)
// when the I/O thread goes away, so late replies are dropped instead of touching freed memory.
struct AsyncReplyChannel {
  std::mutex mu;
  ServerIoThread* thread = nullptr;
};

class ServerIoThread {
 public:
  // A request handed to an I/O thread by another thread.
  struct Command {
    enum class Kind { kNotice, kDisconnect, kStop, kReply } kind;
    std::optional<uint64_t> client_id;
    Notice notice;
    uint64_t grace_deadline_ns = 0;
    // kReply (AsyncReply::Send): the connection, the request and its answer.
    uint64_t connection_id = 0;
    Op op = Op{kFirstServiceOp};
    uint64_t request_id = 0;
    Result<std::vector<uint8_t>> reply = std::vector<uint8_t>();
  };

  ServerIoThread(Server::Impl* server, int index, UniqueFd listen_fd);
  ~ServerIoThread();
  ServerIoThread(const ServerIoThread&) = delete;
  ServerIoThread& operator=(const ServerIoThread&) = delete;

  Status Init(uint32_t ring_entries);
  void Start();
  void Join();
  void Enqueue(Command command);

 private:
  struct Conn {
    FramedConnection io;
    PeerInfo peer;
    ServerHandshake handshake;
    bool ready = false;  // Authenticated.
    bool closing = false;
    bool close_after_send = false;
  };
  struct Delayed {
    uint64_t conn_id;
    ByteBuffer bytes;
  };

  void Run();
  void HandleCqe(uint64_t data, int res, uint32_t flags);
  Conn* Find(uint64_t id);
  void ArmAccept();
  void ArmEvent();
  void OnAccept(UniqueFd fd);
  void ArmRecv(Conn* c);
  void OnRecv(Conn* c, int res);
  void ProcessInput(Conn* c);
  void Dispatch(Conn* c, const ParsedFrame& f);
  void Execute(Conn* c, const ParsedFrame& f, ByteBuffer& out);
  void ExecuteVector(Conn* c, const ParsedFrame& f, ByteBuffer& out);
  void ExecuteService(Conn* c, const ParsedFrame& f, ByteBuffer& out);
  void Flush(Conn* c);
  // The connection's unsent replies are below ServerOptions::max_queued_reply_bytes.
  bool RepliesUnderBound(const Conn* c) const;
  void OnSend(Conn* c, int res);
  void Close(Conn* c, const std::string& reason, LogLevel level);
  void MaybeFree(Conn* c);
  void OnEvent();
  void BeginStop(uint64_t grace_deadline_ns);
  void ArmStopTick();
  void StopStep();

  Server::Impl* server_;
  int index_;
  UniqueFd listen_fd_;
  UniqueFd event_fd_;
  IoRing ring_;
  std::thread thread_;
  std::shared_ptr<AsyncReplyChannel> reply_channel_;
  std::mutex mu_;
  std::deque<Command> commands_;
  uint64_t event_buf_ = 0;
  bool accept_armed_ = false;
  bool event_armed_ = false;
  bool stopping_ = false;
  bool tick_armed_ = false;
  uint64_t grace_deadline_ns_ = 0;
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;
  std::unordered_map<uint64_t, std::unique_ptr<Delayed>> delayed_;
  uint64_t next_delay_id_ = 1;
};

}  // namespace tessera::fabric
