// ControlClient (see fabric/control_client.h).
#include "fabric/control_client.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "fabric/frame_builder.h"
#include "fabric/frame_reader.h"
#include "fabric/handshake.h"
#include "fabric/socket.h"

namespace tessera::fabric {
namespace {

constexpr size_t kMaxKeptNotices = 1024;
constexpr size_t kRecvWindow = 64 * 1024;

template <typename T>
std::vector<uint8_t> Encoded(const T& body) {
  std::vector<uint8_t> out(T::kWireSize);
  body.EncodeTo(out.data());
  return out;
}

// Parses a reply and turns an error response into its Status.
Result<ParsedFrame> Checked(const std::vector<uint8_t>& frame) {
  TESSERA_ASSIGN_OR_RETURN(ParsedFrame f, ParseFrame(frame, Direction::kResponse));
  if (f.header.status != StatusCode::kOk) return StatusFromErrorFrame(f);
  return f;
}

}  // namespace

Result<std::unique_ptr<ControlClient>> ControlClient::Connect(const Endpoint& endpoint,
                                                              const ConnectOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(ClientSocket sock, ConnectAndAuthenticate(endpoint, options));
  return std::unique_ptr<ControlClient>(new ControlClient(
      std::move(sock.fd), endpoint, sock.login.server_id, std::move(sock.login.auth_ok)));
}

ControlClient::ControlClient(UniqueFd fd, Endpoint endpoint, uint64_t server_id,
                             AuthOkResponse auth_ok)
    : fd_(std::move(fd)),
      endpoint_(std::move(endpoint)),
      auth_ok_(std::move(auth_ok)),
      in_(std::make_unique<FrameReader>(kRecvWindow)) {
  info_.server_id = server_id;
  info_.slab_size = auth_ok_.slab_size;
  info_.capacity_bytes = auth_ok_.capacity_bytes;
  info_.rdma = false;
  info_.endpoint = endpoint_;
}

ControlClient::~ControlClient() = default;

void ControlClient::MarkDown(Status reason) {
  if (!down_.ok()) return;
  down_ = std::move(reason);
  fd_.Reset();
}

ControlClient::ReadResult ControlClient::ReadOnce() {
  while (fd_) {
    std::span<uint8_t> space = in_->RecvSpace();
    ssize_t n = ::recv(fd_.get(), space.data(), space.size(), MSG_DONTWAIT);
    if (n > 0) {
      in_->Commit(static_cast<size_t>(n));
      return ReadResult::kData;
    }
    if (n == 0) {
      MarkDown(Unavailable("server ", endpoint_.ToString(), " closed the connection"));
      return ReadResult::kDown;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) return ReadResult::kNothing;
    if (errno == EINTR) continue;
    MarkDown(Unavailable("recv from ", endpoint_.ToString(), ": ", strerror(errno)));
    return ReadResult::kDown;
  }
  return ReadResult::kDown;
}

Result<bool> ControlClient::TakeFrames(uint64_t want_id, Op want_op,
                                       std::vector<uint8_t>* reply) {
  while (true) {
    auto next = in_->Next(Direction::kResponse);
    if (!next.ok()) {
      Status st = next.status().WithContext("malformed frame from " + endpoint_.ToString());
      MarkDown(st);
      return st;
    }
    if (!next->has_value()) return false;
    const FrameReader::Frame& frame = **next;
    if (frame.header.op == Op::kNotice) {
      auto notice = Notice::Decode(frame.payload);
      if (!notice.ok()) {
        Status st = notice.status().WithContext("bad NOTICE from " + endpoint_.ToString());
        MarkDown(st);
        return st;
      }
      if (notices_.size() == kMaxKeptNotices) notices_.pop_front();
      notices_.push_back(*notice);
      in_->Consume(frame);
      continue;
    }
    if (want_id != 0 && frame.header.request_id == want_id) {
      if (frame.header.op != want_op) {
        Status st = ProtocolError(OpName(frame.header.op), " reply to a ", OpName(want_op),
                                  " request from ", endpoint_.ToString());
        MarkDown(st);
        return st;
      }
      std::span<const uint8_t> bytes = in_->FrameBytes(frame);
      reply->assign(bytes.begin(), bytes.end());
      in_->Consume(frame);
      return true;
    }
    in_->Consume(frame);  // The late reply of a call that gave up at its deadline.
  }
}

Result<uint64_t> ControlClient::Send(Op op, std::span<const uint8_t> payload,
                                     Deadline deadline) {
  if (!down_.ok()) {
    return Unavailable("control connection to ", endpoint_.ToString(), " is down: ",
                       down_.message());
  }
  const uint64_t id = next_id_++;
  std::vector<uint8_t> request(kHeaderSize + payload.size());
  EncodeHeader(
      FrameHeader{op, false, id, StatusCode::kOk, static_cast<uint32_t>(payload.size())},
      request.data());
  if (!payload.empty()) std::memcpy(request.data() + kHeaderSize, payload.data(), payload.size());
  Status sent = SendAll(fd_.get(), request, deadline);
  if (!sent.ok()) {
    if (sent.code() == StatusCode::kTimeout) {
      // Part of the frame may be out: the stream cannot be trusted any more.
      MarkDown(Unavailable("send of ", OpName(op), " to ", endpoint_.ToString(), " timed out"));
      return Timeout(OpName(op), " to ", endpoint_.ToString(), ": no reply before the deadline");
    }
    Status st = sent.WithContext("send to " + endpoint_.ToString());
    MarkDown(st);
    return st;
  }
  return id;
}

Result<std::vector<uint8_t>> ControlClient::Call(Op op, std::span<const uint8_t> payload,
                                                 Deadline deadline) {
  TESSERA_ASSIGN_OR_RETURN(const uint64_t id, Send(op, payload, deadline));
  std::vector<uint8_t> reply;
  while (true) {
    TESSERA_ASSIGN_OR_RETURN(bool got, TakeFrames(id, op, &reply));
    if (got) return reply;
    Status ready = WaitFd(fd_.get(), POLLIN, deadline, "control reply");
    if (!ready.ok()) {
      if (ready.code() == StatusCode::kTimeout) {
        // A last look: the reply may have arrived while this thread was not running (the
        // deadline then measured the caller's stall, not the server's).
        if (ReadOnce() != ReadResult::kDown) {
          TESSERA_ASSIGN_OR_RETURN(got, TakeFrames(id, op, &reply));
          if (got) return reply;
        }
        return Timeout(OpName(op), " to ", endpoint_.ToString(), ": no reply before the deadline");
      }
      MarkDown(ready);
      return ready;
    }
    if (ReadOnce() == ReadResult::kDown) {
      // Frames that arrived just before the close still count (e.g. the GOODBYE reply).
      TESSERA_ASSIGN_OR_RETURN(got, TakeFrames(id, op, &reply));
      if (got) return reply;
      return down_;
    }
  }
}

Result<uint64_t> ControlClient::SendHeartbeat(Deadline deadline) {
  return Send(Op::kHeartbeat, {}, deadline);
}

Result<bool> ControlClient::PollHeartbeat(uint64_t id) {
  std::vector<uint8_t> reply;
  while (true) {
    TESSERA_ASSIGN_OR_RETURN(bool got, TakeFrames(id, Op::kHeartbeat, &reply));
    if (got) {
      TESSERA_ASSIGN_OR_RETURN(ParsedFrame f, Checked(reply));
      (void)f;
      return true;
    }
    const ReadResult r = ReadOnce();
    if (r == ReadResult::kData) continue;
    if (r == ReadResult::kDown) {
      TESSERA_ASSIGN_OR_RETURN(got, TakeFrames(id, Op::kHeartbeat, &reply));
      if (got) return true;
      return down_;
    }
    return false;
  }
}

Result<AllocSlabResponse> ControlClient::AllocSlab(const AllocSlabRequest& req,
                                                   Deadline deadline) {
  TESSERA_ASSIGN_OR_RETURN(auto frame, Call(Op::kAllocSlab, Encoded(req), deadline));
  TESSERA_ASSIGN_OR_RETURN(ParsedFrame f, Checked(frame));
  return std::get<AllocSlabResponse>(f.body);
}

Status ControlClient::FreeSlab(uint64_t slab_id, Deadline deadline) {
  if (slab_id == 0) return InvalidArgument("slab_id must be non-zero");
  TESSERA_ASSIGN_OR_RETURN(auto frame,
                           Call(Op::kFreeSlab, Encoded(FreeSlabRequest{slab_id}), deadline));
  return Checked(frame).status();
}

Result<std::string> ControlClient::Stats(Deadline deadline) {
  TESSERA_ASSIGN_OR_RETURN(auto frame, Call(Op::kStats, {}, deadline));
  TESSERA_ASSIGN_OR_RETURN(ParsedFrame f, Checked(frame));
  return std::string(reinterpret_cast<const char*>(f.data.data()), f.data.size());
}

Result<HeartbeatResponse> ControlClient::Heartbeat(Deadline deadline) {
  TESSERA_ASSIGN_OR_RETURN(auto frame, Call(Op::kHeartbeat, {}, deadline));
  TESSERA_ASSIGN_OR_RETURN(ParsedFrame f, Checked(frame));
  return std::get<HeartbeatResponse>(f.body);
}

Result<std::vector<uint8_t>> ControlClient::Invoke(uint32_t function_id,
                                                   std::span<const uint8_t> args,
                                                   Deadline deadline) {
  if (args.size() > kMaxDataLength) {
    return InvalidArgument("INVOKE args of ", args.size(), " bytes exceed ", kMaxDataLength);
  }
  std::vector<uint8_t> payload(InvokeRequest::kWireSize + args.size());
  InvokeRequest{function_id}.EncodeTo(payload.data());
  if (!args.empty()) {
    std::memcpy(payload.data() + InvokeRequest::kWireSize, args.data(), args.size());
  }
  TESSERA_ASSIGN_OR_RETURN(auto frame, Call(Op::kInvoke, payload, deadline));
  TESSERA_ASSIGN_OR_RETURN(ParsedFrame f, Checked(frame));
  return std::vector<uint8_t>(f.data.begin(), f.data.end());
}

Status ControlClient::Fault(const FaultRequest& req, Deadline deadline) {
  std::vector<uint8_t> payload = Encoded(req);
  TESSERA_RETURN_IF_ERROR(FaultRequest::Decode(payload).status());
  TESSERA_ASSIGN_OR_RETURN(auto frame, Call(Op::kFault, payload, deadline));
  return Checked(frame).status();
}

Status ControlClient::Close(Deadline deadline) {
  if (!down_.ok()) return Status::Ok();
  auto r = Call(Op::kGoodbye, {}, deadline);
  MarkDown(Cancelled("control connection closed by Close()"));
  if (!r.ok() && r.status().code() != StatusCode::kUnavailable) return r.status();
  return Status::Ok();
}

size_t ControlClient::PollNotices(std::span<Notice> out) {
  std::vector<uint8_t> none;
  while (fd_) {
    ReadResult r = ReadOnce();
    (void)TakeFrames(0, Op::kNotice, &none);  // Queues the notices (and skips stale replies).
    if (r != ReadResult::kData) break;
  }
  size_t n = 0;
  while (n < out.size() && !notices_.empty()) {
    out[n++] = notices_.front();
    notices_.pop_front();
  }
  return n;
}

}  // namespace tessera::fabric
