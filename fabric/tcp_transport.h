// Internal to fabric/: the TCP-on-io_uring Transport (see fabric/transport.h for the contract).
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "fabric/framed_connection.h"
#include "fabric/handshake.h"
#include "fabric/io_ring.h"
#include "fabric/transport.h"

namespace tessera::fabric {

class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(const TransportOptions& options);
  ~TcpTransport() override;
  Status Init();

  TransportKind kind() const override { return TransportKind::kTcp; }
  Result<ConnectionId> Connect(const Endpoint& endpoint, const ConnectOptions& options) override;
  Status Disconnect(ConnectionId connection) override;
  Status Abort(ConnectionId connection) override;
  Result<ServerInfo> Info(ConnectionId connection) const override;
  bool Connected(ConnectionId connection) const override;
  Status RegisterMemory(void* addr, size_t length) override;
  Status Post(std::span<const WorkRequest> batch) override;
  size_t Poll(std::span<Completion> out) override;
  size_t Wait(std::span<Completion> out, Deadline deadline) override;
  uint32_t inflight() const override { return inflight_; }
  Status SetWakeFd(int fd) override;

  Status AddSlab(ConnectionId connection, const AllocSlabResponse& slab) override;
  void RemoveSlab(ConnectionId connection, uint64_t slab_id) override;

 private:
  struct Conn {
    FramedConnection io;
    ServerInfo info;
    bool up = false;
    Status down_reason;
    bool touched = false;
    bool goodbye = false;  // Disconnect() sent GOODBYE: the server's close is expected.
    uint32_t inflight = 0;
    std::vector<uint32_t> batch_reads, batch_writes;  // Post(): this batch's ops, by kind.
  };
  struct Slot {
    bool used = false;
    uint32_t gen = 0;
    OpKind op = OpKind::kRead;
    ConnectionId conn = 0;
    uint32_t length = 0;
    void* local = nullptr;
    uint64_t cookie = 0;
    // Vectored request: the head slot (whose id the frame carries) chains its members through
    // `next` in range order; members are never answered by id.
    bool vector_head = false;
    bool member = false;
    uint32_t next = kNoSlot;
    uint32_t vector_total = 0;  // Head: sum of the ranges' lengths.
  };
  static constexpr uint32_t kNoSlot = ~0u;
  struct ControlWait {
    ConnectionId conn = 0;
    Op op = Op::kStats;
    bool done = false;
    Status failure;
    std::vector<uint8_t> frame;
  };

  uint32_t TakeSlot(const WorkRequest& wr);
  void EncodeGroup(Conn* c, std::span<const WorkRequest> batch, const std::vector<uint32_t>& ops,
                   OpKind kind);
  Status CheckConn(ConnectionId id) const;
  void ArmRecv(ConnectionId id);
  void Flush(ConnectionId id);
  bool Reap();
  void OnRecv(ConnectionId id, int res);
  Status HandleFrame(ConnectionId id, const FrameHeader& h, std::span<const uint8_t> payload);
  void CompleteSlot(uint32_t slot_index, Status status);
  void PushCompletion(Completion c);
  size_t Drain(std::span<Completion> out);
  void MarkDown(ConnectionId id, Status reason);
  void ReleaseConn(ConnectionId id);
  void WaitKernel(Deadline deadline);
  void ArmWake();
  // Sends a request with an empty payload on the data connection and waits for its reply
  // (GOODBYE only: control calls are ControlClient's).
  Result<std::vector<uint8_t>> Control(ConnectionId id, Op op, Deadline deadline);

  TransportOptions options_;
  // Enabled by the first Connect(), so the thread that uses the transport becomes its single
  // issuer. With deferred task work the kernel never interrupts the polling thread; Poll()
  // collects completions by entering the kernel itself.
  IoRing ring_;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  uint32_t inflight_ = 0;
  std::vector<Completion> ready_;  // Ring buffer of completions not yet returned.
  size_t ready_head_ = 0;
  size_t ready_count_ = 0;
  std::vector<ConnectionId> touched_;
  std::unordered_map<uint64_t, ControlWait> controls_;
  uint64_t next_control_ = 1;
  // SetWakeFd(): a multishot poll on the fd; its CQE ends Wait().
  int wake_fd_ = -1;
  uint32_t wake_gen_ = 1;  // Tags the current watch's CQEs.
  bool wake_armed_ = false;
  bool woken_ = false;
};

}  // namespace tessera::fabric
