#include "apps/paramsvc/wire/wire.h"

#include <cmath>
#include <cstring>

namespace tessera::paramsvc {
namespace {

// Sequential little-endian reader that records the first error (field name + reason).
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  bool Need(size_t n, const char* what) {
    if (!err_.ok()) return false;
    if (b_.size() - pos_ < n) {
      err_ = ProtocolError("truncated message: ", what, " needs ", n, " bytes, ",
                           b_.size() - pos_, " left");
      return false;
    }
    return true;
  }
  uint8_t U8(const char* what) { return Need(1, what) ? b_[pos_++] : 0; }
  uint16_t U16(const char* what) {
    if (!Need(2, what)) return 0;
    pos_ += 2;
    return Get16(b_.data() + pos_ - 2);
  }
  uint32_t U32(const char* what) {
    if (!Need(4, what)) return 0;
    pos_ += 4;
    return Get32(b_.data() + pos_ - 4);
  }
  uint64_t U64(const char* what) {
    if (!Need(8, what)) return 0;
    pos_ += 8;
    return Get64(b_.data() + pos_ - 8);
  }
  float F32(const char* what) {
    uint32_t v = U32(what);
    float f;
    std::memcpy(&f, &v, 4);
    return f;
  }
  std::string Str(const char* what) {
    uint16_t n = U16(what);
    if (n > kMaxNameLength) {
      Fail(InvalidArgument(what, " is ", n, " bytes (at most ", kMaxNameLength, ")"));
      return {};
    }
    if (!Need(n, what)) return {};
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  void Fail(Status s) {
    if (err_.ok()) err_ = std::move(s);
  }
  Status Finish(const char* msg) {
    if (err_.ok() && pos_ != b_.size()) {
      err_ = ProtocolError(msg, ": ", b_.size() - pos_, " trailing bytes");
    }
    return err_;
  }
  size_t pos() const { return pos_; }
  const Status& err() const { return err_; }

 private:
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
  Status err_;
};

class Writer {
 public:
  void U8(uint8_t v) { b_.push_back(v); }
  void U16(uint16_t v) { Grow(2); Put16(b_.data() + b_.size() - 2, v); }
  void U32(uint32_t v) { Grow(4); Put32(b_.data() + b_.size() - 4, v); }
  void U64(uint64_t v) { Grow(8); Put64(b_.data() + b_.size() - 8, v); }
  void F32(float f) {
    uint32_t v;
    std::memcpy(&v, &f, 4);
    U32(v);
  }
  void Str(const std::string& s) {
    U16(static_cast<uint16_t>(s.size()));
    b_.insert(b_.end(), s.begin(), s.end());
  }
  std::vector<uint8_t> Take() { return std::move(b_); }

 private:
  void Grow(size_t n) { b_.resize(b_.size() + n); }
  std::vector<uint8_t> b_;
};

Status CheckDType(uint8_t d, const char* what) {
  if (d >= kNumDTypes) return InvalidArgument(what, ": unknown dtype ", int{d}, " (0 fp32, 1 fp16, 2 bf16)");
  return Status::Ok();
}

Status CheckFixed(std::span<const uint8_t> b, size_t want, const char* what) {
  if (b.size() != want) {
    return ProtocolError(what, " is ", b.size(), " bytes, expected ", want);
  }
  return Status::Ok();
}

}  // namespace

const char* OpName(uint8_t op) {
  switch (static_cast<Op>(op)) {
    case Op::kError: return "ERROR";
    case Op::kHello: return "HELLO";
    case Op::kAuth: return "AUTH";
    case Op::kRegister: return "REGISTER";
    case Op::kPush: return "PUSH";
    case Op::kPull: return "PULL";
    case Op::kBarrier: return "BARRIER";
    case Op::kStatus: return "STATUS";
    case Op::kSetParams: return "SET_PARAMS";
    case Op::kRelease: return "RELEASE";
    case Op::kMigrate: return "MIGRATE";
    case Op::kCores: return "CORES";
    case Op::kSetLr: return "SET_LR";
    case Op::kMoveJob: return "MOVE_JOB";
    case Op::kImportBegin: return "IMPORT_BEGIN";
    case Op::kImportPart: return "IMPORT_PART";
    case Op::kImportPrepare: return "IMPORT_PREPARE";
    case Op::kImportCommit: return "IMPORT_COMMIT";
    case Op::kImportAbort: return "IMPORT_ABORT";
    case Op::kMoveStatus: return "MOVE_STATUS";
    case Op::kDrain: return "DRAIN";
    case Op::kGetState: return "GET_STATE";
    case Op::kPutState: return "PUT_STATE";
  }
  return "UNKNOWN";
}

uint32_t MaxPayload(uint8_t op) {
  switch (static_cast<Op>(op)) {
    case Op::kImportPart:
    case Op::kGetState:
    case Op::kPutState:
      return kMaxStatePayload;
    default:
      return kMaxPayload;
  }
}

void EncodeHeader(const Header& h, uint8_t* out) {
  Put32(out, kMagic);
  out[4] = kWireVersion;
  out[5] = h.op;
  Put16(out + 6, h.status);
  Put32(out + 8, h.payload_len);
  Put32(out + 12, h.job);
  Put64(out + 16, h.request_id);
}

Result<Header> DecodeHeader(std::span<const uint8_t> b) {
  if (b.size() != kHeaderSize) return ProtocolError("header is ", b.size(), " bytes, expected 24");
  if (Get32(b.data()) != kMagic) {
    return ProtocolError("bad magic 0x", std::hex, Get32(b.data()), " (not a paramsvc peer?)");
  }
  if (b[4] != kWireVersion) {
    return ProtocolError("unsupported protocol version ", int{b[4]}, " (this side speaks ",
                         int{kWireVersion}, ")");
  }
  Header h;
  h.op = b[5];
  h.status = Get16(b.data() + 6);
  if (std::strcmp(OpName(h.op), "UNKNOWN") == 0 || (h.op == 0 && h.status == 0)) {
    return ProtocolError("unknown op ", int{h.op});
  }
  h.payload_len = Get32(b.data() + 8);
  if (h.payload_len > MaxPayload(h.op)) {
    return ProtocolError(OpName(h.op), " payload of ", h.payload_len, " bytes exceeds the limit of ",
                         MaxPayload(h.op));
  }
  h.job = Get32(b.data() + 12);
  h.request_id = Get64(b.data() + 16);
  return h;
}

const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kSync: return "sync";
    case Mode::kAsync: return "async";
    case Mode::kBounded: return "bounded";
  }
  return "?";
}

Result<std::pair<Mode, uint32_t>> ParseMode(std::string_view t) {
  if (t == "sync") return std::make_pair(Mode::kSync, 0u);
  if (t == "async") return std::make_pair(Mode::kAsync, 0u);
  std::string_view num;
  if (t.starts_with("bounded(") && t.ends_with(")")) {
    num = t.substr(8, t.size() - 9);
  } else if (t.starts_with("bounded:")) {
    num = t.substr(8);
  } else {
    return InvalidArgument("unknown consistency mode '", std::string(t),
                           "' (sync, async, bounded(s))");
  }
  if (num.empty() || num.size() > 6) return InvalidArgument("bad staleness in '", std::string(t), "'");
  uint32_t s = 0;
  for (char c : num) {
    if (c < '0' || c > '9') return InvalidArgument("bad staleness in '", std::string(t), "'");
    s = s * 10 + (c - '0');
  }
  if (s > 1000) return InvalidArgument("staleness ", s, " is above 1000");
  return std::make_pair(Mode::kBounded, s);
}

uint64_t TensorSpec::elements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

Status JobSpec::Validate() const {
  if (name.empty() || name.size() > kMaxNameLength) {
    return InvalidArgument("job name must be 1..", kMaxNameLength, " bytes");
  }
  if (workers < 1 || workers > kMaxWorkers) {
    return InvalidArgument("job '", name, "': workers ", workers, " not in 1..", kMaxWorkers);
  }
  if (static_cast<uint8_t>(mode) > 2) return InvalidArgument("job '", name, "': unknown mode");
  if (mode == Mode::kBounded && staleness > 1000) {
    return InvalidArgument("job '", name, "': staleness ", staleness, " above 1000");
  }
  if (static_cast<uint8_t>(late) > 1) return InvalidArgument("job '", name, "': unknown late policy");
  if (static_cast<uint8_t>(optimizer.kind) > 2) {
    return InvalidArgument("job '", name, "': unknown optimizer");
  }
  auto finite = [](float f) { return std::isfinite(f); };
  if (!finite(optimizer.lr) || optimizer.lr < 0 || !finite(optimizer.momentum) ||
      optimizer.momentum < 0 || optimizer.momentum >= 1 || !finite(optimizer.weight_decay) ||
      optimizer.weight_decay < 0 || !(optimizer.beta1 >= 0 && optimizer.beta1 < 1) ||
      !(optimizer.beta2 >= 0 && optimizer.beta2 < 1) || !(optimizer.eps > 0) ||
      !finite(optimizer.eps)) {
    return InvalidArgument("job '", name,
                           "': optimizer settings out of range (lr >= 0, 0 <= momentum < 1, "
                           "weight_decay >= 0, betas in [0,1), eps > 0)");
  }
  if (partition_bytes < 4096 || partition_bytes > kMaxPartitionBytes || partition_bytes % 4 != 0) {
    return InvalidArgument("job '", name, "': partition_bytes ", partition_bytes,
                           " not a multiple of 4 in 4096..", kMaxPartitionBytes);
  }
  if (tensors.empty() || tensors.size() > kMaxTensors) {
    return InvalidArgument("job '", name, "': ", tensors.size(), " tensors (1..", kMaxTensors, ")");
  }
  uint64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& t = tensors[i];
    if (t.name.empty() || t.name.size() > kMaxNameLength) {
      return InvalidArgument("job '", name, "': tensor ", i, " name must be 1..", kMaxNameLength,
                             " bytes");
    }
    if (static_cast<uint8_t>(t.dtype) >= kNumDTypes) {
      return InvalidArgument("job '", name, "': tensor '", t.name, "' has an unknown dtype");
    }
    if (t.shape.empty() || t.shape.size() > 8) {
      return InvalidArgument("job '", name, "': tensor '", t.name, "' has ", t.shape.size(),
                             " dims (1..8)");
    }
    uint64_t n = 1;
    for (uint64_t d : t.shape) {
      if (d == 0 || d > (1ull << 34)) {
        return InvalidArgument("job '", name, "': tensor '", t.name, "' has a dim of ", d);
      }
      n *= d;
      if (n > (1ull << 32)) {
        return InvalidArgument("job '", name, "': tensor '", t.name, "' is too large");
      }
    }
    total += n * 4;
    if (total > kMaxModelBytes) {
      return InvalidArgument("job '", name, "': model above ", kMaxModelBytes >> 30, " GiB");
    }
  }
  return Status::Ok();
}

bool JobSpec::SameModel(const JobSpec& o) const {
  if (workers != o.workers || mode != o.mode || staleness != o.staleness || late != o.late ||
      partition_bytes != o.partition_bytes || tensors.size() != o.tensors.size() ||
      optimizer.kind != o.optimizer.kind || optimizer.lr != o.optimizer.lr ||
      optimizer.momentum != o.optimizer.momentum) {
    return false;
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name != o.tensors[i].name || tensors[i].dtype != o.tensors[i].dtype ||
        tensors[i].shape != o.tensors[i].shape) {
      return false;
    }
  }
  return true;
}

std::vector<uint8_t> JobSpec::Encode() const {
  Writer w;
  w.Str(name);
  w.U32(workers);
  w.U8(static_cast<uint8_t>(mode));
  w.U32(staleness);
  w.U8(static_cast<uint8_t>(late));
  w.U8(static_cast<uint8_t>(optimizer.kind));
  w.F32(optimizer.lr);
  w.F32(optimizer.momentum);
  w.F32(optimizer.weight_decay);
  w.F32(optimizer.beta1);
  w.F32(optimizer.beta2);
  w.F32(optimizer.eps);
  w.U32(partition_bytes);
  w.U32(static_cast<uint32_t>(tensors.size()));
  for (const TensorSpec& t : tensors) {
    w.Str(t.name);
    w.U8(static_cast<uint8_t>(t.dtype));
    w.U8(static_cast<uint8_t>(t.shape.size()));
    for (uint64_t d : t.shape) w.U64(d);
  }
  return w.Take();
}

Result<JobSpec> JobSpec::Decode(std::span<const uint8_t> b) {
  Reader r(b);
  JobSpec s;
  s.name = r.Str("job name");
  s.workers = r.U32("workers");
  uint8_t mode = r.U8("mode");
  if (r.err().ok() && mode > 2) r.Fail(InvalidArgument("unknown consistency mode ", int{mode}));
  s.mode = static_cast<Mode>(mode);
  s.staleness = r.U32("staleness");
  uint8_t late = r.U8("late policy");
  if (r.err().ok() && late > 1) r.Fail(InvalidArgument("unknown late policy ", int{late}));
  s.late = static_cast<LatePolicy>(late);
  uint8_t opt = r.U8("optimizer");
  if (r.err().ok() && opt > 2) r.Fail(InvalidArgument("unknown optimizer ", int{opt}));
  s.optimizer.kind = static_cast<OptimizerKind>(opt);
  s.optimizer.lr = r.F32("lr");
  s.optimizer.momentum = r.F32("momentum");
  s.optimizer.weight_decay = r.F32("weight_decay");
  s.optimizer.beta1 = r.F32("beta1");
  s.optimizer.beta2 = r.F32("beta2");
  s.optimizer.eps = r.F32("eps");
  s.partition_bytes = r.U32("partition_bytes");
  uint32_t nt = r.U32("tensor count");
  if (r.err().ok() && (nt == 0 || nt > kMaxTensors)) {
    r.Fail(InvalidArgument("tensor count ", nt, " not in 1..", kMaxTensors));
  }
  for (uint32_t i = 0; r.err().ok() && i < nt; ++i) {
    TensorSpec t;
    t.name = r.Str("tensor name");
    uint8_t d = r.U8("dtype");
    if (r.err().ok()) r.Fail(CheckDType(d, "tensor"));
    t.dtype = static_cast<DType>(d);
    uint8_t nd = r.U8("ndims");
    if (r.err().ok() && (nd == 0 || nd > 8)) {
      r.Fail(InvalidArgument("tensor '", t.name, "' has ", int{nd}, " dims (1..8)"));
    }
    for (uint8_t k = 0; r.err().ok() && k < nd; ++k) t.shape.push_back(r.U64("dim"));
    s.tensors.push_back(std::move(t));
  }
  Status st = r.Finish("REGISTER");
  if (!st.ok()) return st;
  Status v = s.Validate();
  if (!v.ok()) return v;
  return s;
}

std::vector<PartitionInfo> PartitionModel(const JobSpec& spec) {
  std::vector<PartitionInfo> out;
  const uint64_t per = spec.partition_bytes / 4;
  for (uint32_t t = 0; t < spec.tensors.size(); ++t) {
    const uint64_t n = spec.tensors[t].elements();
    for (uint64_t off = 0; off < n; off += per) {
      out.push_back({t, off, static_cast<uint32_t>(std::min(per, n - off))});
    }
  }
  return out;
}

std::vector<uint8_t> JobLayout::Encode() const {
  Writer w;
  w.U32(job);
  w.U32(static_cast<uint32_t>(partitions.size()));
  for (const auto& p : partitions) {
    w.U32(p.tensor);
    w.U64(p.offset);
    w.U32(p.count);
  }
  return w.Take();
}

Result<JobLayout> JobLayout::Decode(std::span<const uint8_t> b) {
  Reader r(b);
  JobLayout l;
  l.job = r.U32("job");
  uint32_t n = r.U32("partition count");
  if (r.err().ok() && n > (b.size() / 16)) r.Fail(ProtocolError("partition count ", n, " too large"));
  for (uint32_t i = 0; r.err().ok() && i < n; ++i) {
    PartitionInfo p;
    p.tensor = r.U32("tensor");
    p.offset = r.U64("offset");
    p.count = r.U32("count");
    l.partitions.push_back(p);
  }
  Status st = r.Finish("layout");
  if (!st.ok()) return st;
  return l;
}

void PushRequest::EncodeFixed(uint8_t* out) const {
  Put32(out, worker);
  Put32(out + 4, partition);
  Put64(out + 8, version);
  out[16] = static_cast<uint8_t>(dtype);
  out[17] = out[18] = out[19] = 0;
  Put32(out + 20, count);
}

Result<PushRequest> PushRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() < kFixed) return ProtocolError("PUSH is ", b.size(), " bytes, at least ", kFixed);
  PushRequest p;
  p.worker = Get32(b.data());
  p.partition = Get32(b.data() + 4);
  p.version = Get64(b.data() + 8);
  Status d = CheckDType(b[16], "PUSH");
  if (!d.ok()) return d;
  if (b[17] | b[18] | b[19]) return ProtocolError("PUSH padding is not zero");
  p.dtype = static_cast<DType>(b[16]);
  p.count = Get32(b.data() + 20);
  const uint64_t want = static_cast<uint64_t>(p.count) * DTypeSize(p.dtype);
  if (b.size() - kFixed != want) {
    return InvalidArgument("PUSH of ", p.count, " ", DTypeName(p.dtype), " elements carries ",
                           b.size() - kFixed, " data bytes, expected ", want);
  }
  p.data = b.subspan(kFixed);
  return p;
}

void PushReply::EncodeTo(uint8_t* out) const {
  out[0] = static_cast<uint8_t>(outcome);
  out[1] = out[2] = out[3] = 0;
  Put32(out + 4, staleness);
  Put64(out + 8, version);
}

Result<PushReply> PushReply::Decode(std::span<const uint8_t> b) {
  Status s = CheckFixed(b, kWireSize, "PUSH reply");
  if (!s.ok()) return s;
  if (b[0] > 3) return ProtocolError("PUSH reply: unknown outcome ", int{b[0]});
  PushReply r;
  r.outcome = static_cast<PushOutcome>(b[0]);
  r.staleness = Get32(b.data() + 4);
  r.version = Get64(b.data() + 8);
  return r;
}

void PullRequest::EncodeTo(uint8_t* out) const {
  Put32(out, partition);
  out[4] = static_cast<uint8_t>(dtype);
  out[5] = out[6] = out[7] = 0;
  Put64(out + 8, min_version);
  Put32(out + 16, timeout_ms);
}

Result<PullRequest> PullRequest::Decode(std::span<const uint8_t> b) {
  Status s = CheckFixed(b, kWireSize, "PULL");
  if (!s.ok()) return s;
  PullRequest p;
  p.partition = Get32(b.data());
  Status d = CheckDType(b[4], "PULL");
  if (!d.ok()) return d;
  if (b[5] | b[6] | b[7]) return ProtocolError("PULL padding is not zero");
  p.dtype = static_cast<DType>(b[4]);
  p.min_version = Get64(b.data() + 8);
  p.timeout_ms = Get32(b.data() + 16);
  if (p.timeout_ms > 600000) return InvalidArgument("PULL timeout_ms ", p.timeout_ms, " above 600000");
  return p;
}

Result<PullReply> PullReply::Decode(std::span<const uint8_t> b) {
  if (b.size() < kFixed) return ProtocolError("PULL reply is ", b.size(), " bytes");
  PullReply r;
  r.version = Get64(b.data());
  r.count = Get32(b.data() + 8);
  Status d = CheckDType(b[12], "PULL reply");
  if (!d.ok()) return d;
  r.dtype = static_cast<DType>(b[12]);
  if (b.size() - kFixed != static_cast<uint64_t>(r.count) * DTypeSize(r.dtype)) {
    return ProtocolError("PULL reply data size does not match its count");
  }
  r.data = b.subspan(kFixed);
  return r;
}

void BarrierRequest::EncodeTo(uint8_t* out) const {
  Put32(out, worker);
  Put32(out + 4, timeout_ms);
  Put64(out + 8, iteration);
}

Result<BarrierRequest> BarrierRequest::Decode(std::span<const uint8_t> b) {
  Status s = CheckFixed(b, kWireSize, "BARRIER");
  if (!s.ok()) return s;
  BarrierRequest r;
  r.worker = Get32(b.data());
  r.timeout_ms = Get32(b.data() + 4);
  r.iteration = Get64(b.data() + 8);
  if (r.timeout_ms > 600000) return InvalidArgument("BARRIER timeout_ms ", r.timeout_ms, " above 600000");
  return r;
}

void SetParamsRequest::EncodeFixed(uint8_t* out) const {
  Put32(out, partition);
  out[4] = static_cast<uint8_t>(dtype);
  out[5] = out[6] = out[7] = 0;
  Put32(out + 8, count);
}

Result<SetParamsRequest> SetParamsRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() < kFixed) return ProtocolError("SET_PARAMS is ", b.size(), " bytes");
  SetParamsRequest p;
  p.partition = Get32(b.data());
  Status d = CheckDType(b[4], "SET_PARAMS");
  if (!d.ok()) return d;
  if (b[5] | b[6] | b[7]) return ProtocolError("SET_PARAMS padding is not zero");
  p.dtype = static_cast<DType>(b[4]);
  p.count = Get32(b.data() + 8);
  if (b.size() - kFixed != static_cast<uint64_t>(p.count) * DTypeSize(p.dtype)) {
    return InvalidArgument("SET_PARAMS of ", p.count, " elements carries ", b.size() - kFixed,
                           " data bytes");
  }
  p.data = b.subspan(kFixed);
  return p;
}

void MigrateRequest::EncodeTo(uint8_t* out) const {
  Put32(out, partition);
  Put32(out + 4, core);
}
Result<MigrateRequest> MigrateRequest::Decode(std::span<const uint8_t> b) {
  Status s = CheckFixed(b, kWireSize, "MIGRATE");
  if (!s.ok()) return s;
  return MigrateRequest{Get32(b.data()), Get32(b.data() + 4)};
}

void CoresRequest::EncodeTo(uint8_t* out) const {
  Put32(out, max_cores);
  Put32(out + 4, elastic);
}
Result<CoresRequest> CoresRequest::Decode(std::span<const uint8_t> b) {
  Status s = CheckFixed(b, kWireSize, "CORES");
  if (!s.ok()) return s;
  CoresRequest r{Get32(b.data()), Get32(b.data() + 4)};
  if (r.max_cores < 1 || r.max_cores > 256) return InvalidArgument("CORES max_cores ", r.max_cores, " not in 1..256");
  if (r.elastic > 1) return InvalidArgument("CORES elastic must be 0 or 1");
  return r;
}

Status CheckEndpointText(std::string_view text, const char* what) {
  const size_t colon = text.rfind(':');
  if (text.empty() || text.size() > kMaxNameLength || colon == std::string_view::npos ||
      colon == 0 || colon + 1 == text.size()) {
    return InvalidArgument(what, " '", std::string(text), "' is not HOST:PORT");
  }
  uint32_t port = 0;
  for (char c : text.substr(colon + 1)) {
    if (c < '0' || c > '9' || port > 65535) {
      return InvalidArgument(what, " '", std::string(text), "' has a bad port");
    }
    port = port * 10 + static_cast<uint32_t>(c - '0');
  }
  if (port == 0 || port > 65535) {
    return InvalidArgument(what, " '", std::string(text), "' has a port outside 1..65535");
  }
  for (char c : text.substr(0, colon)) {
    if (static_cast<unsigned char>(c) <= ' ' || c == '/' || c == 0x7f) {
      return InvalidArgument(what, " '", std::string(text), "' has a bad host");
    }
  }
  return Status::Ok();
}

std::vector<uint8_t> MoveJobRequest::Encode() const {
  Writer w;
  w.Str(job);
  w.Str(to);
  w.U32(boundary_timeout_ms);
  w.U8(allow_volatile ? 1 : 0);
  return w.Take();
}

Result<MoveJobRequest> MoveJobRequest::Decode(std::span<const uint8_t> b) {
  Reader r(b);
  MoveJobRequest m;
  m.job = r.Str("job name");
  m.to = r.Str("destination");
  m.boundary_timeout_ms = r.U32("boundary_timeout_ms");
  const uint8_t flags = r.U8("flags");
  Status st = r.Finish("MOVE_JOB");
  if (!st.ok()) return st;
  if (m.job.empty()) return InvalidArgument("MOVE_JOB: no job name");
  if (Status e = CheckEndpointText(m.to, "MOVE_JOB destination"); !e.ok()) return e;
  if (m.boundary_timeout_ms < 100 || m.boundary_timeout_ms > 600000) {
    return InvalidArgument("MOVE_JOB boundary_timeout_ms ", m.boundary_timeout_ms,
                           " not in 100..600000");
  }
  if (flags > 1) return InvalidArgument("MOVE_JOB: unknown flags ", int{flags});
  m.allow_volatile = flags == 1;
  return m;
}

std::vector<uint8_t> ImportBegin::Encode() const {
  Writer w;
  w.U64(move_id);
  w.Str(source);
  std::vector<uint8_t> out = w.Take();
  const auto sp = spec.Encode();
  out.insert(out.end(), sp.begin(), sp.end());
  return out;
}

Result<ImportBegin> ImportBegin::Decode(std::span<const uint8_t> b) {
  Reader r(b);
  ImportBegin m;
  m.move_id = r.U64("move id");
  m.source = r.Str("source");
  if (!r.err().ok()) return r.err();
  if (m.move_id == 0) return InvalidArgument("IMPORT_BEGIN: move id 0");
  if (Status e = CheckEndpointText(m.source, "IMPORT_BEGIN source"); !e.ok()) return e;
  auto spec = JobSpec::Decode(b.subspan(r.pos()));
  if (!spec.ok()) return spec.status();
  m.spec = std::move(*spec);
  return m;
}

std::vector<uint8_t> ImportPart::EncodeFixed(uint64_t move_id, uint32_t partition,
                                             uint32_t state_len) {
  std::vector<uint8_t> out(16);
  Put64(out.data(), move_id);
  Put32(out.data() + 8, partition);
  Put32(out.data() + 12, state_len);
  return out;
}

Result<ImportPart> ImportPart::Decode(std::span<const uint8_t> b) {
  if (b.size() < 16) return ProtocolError("IMPORT_PART is ", b.size(), " bytes, at least 16");
  ImportPart m;
  m.move_id = Get64(b.data());
  m.partition = Get32(b.data() + 8);
  const uint32_t len = Get32(b.data() + 12);
  if (b.size() - 16 < len) {
    return ProtocolError("IMPORT_PART: a state of ", len, " bytes in ", b.size() - 16);
  }
  m.state = b.subspan(16, len);
  m.counters = b.subspan(16 + len);
  return m;
}

void ImportPrepare::EncodeTo(uint8_t* out) const {
  Put64(out, move_id);
  uint32_t bits;
  std::memcpy(&bits, &lr, 4);
  Put32(out + 8, bits);
  Put64(out + 12, moves);
}

Result<ImportPrepare> ImportPrepare::Decode(std::span<const uint8_t> b) {
  Status s = CheckFixed(b, kWireSize, "IMPORT_PREPARE");
  if (!s.ok()) return s;
  ImportPrepare m;
  m.move_id = Get64(b.data());
  const uint32_t bits = Get32(b.data() + 8);
  std::memcpy(&m.lr, &bits, 4);
  m.moves = Get64(b.data() + 12);
  if (!std::isfinite(m.lr) || m.lr < 0) return InvalidArgument("IMPORT_PREPARE lr ", m.lr);
  return m;
}

std::vector<uint8_t> MoveRef::Encode() const {
  Writer w;
  w.U64(move_id);
  w.Str(job);
  return w.Take();
}

Result<MoveRef> MoveRef::Decode(std::span<const uint8_t> b) {
  Reader r(b);
  MoveRef m;
  m.move_id = r.U64("move id");
  m.job = r.Str("job name");
  Status st = r.Finish("move reference");
  if (!st.ok()) return st;
  if (m.move_id == 0 || m.job.empty()) return InvalidArgument("move reference without an id or a job");
  return m;
}

std::vector<uint8_t> DrainRequest::Encode() const {
  Writer w;
  w.U8(on ? 1 : 0);
  w.Str(redirect);
  return w.Take();
}

Result<DrainRequest> DrainRequest::Decode(std::span<const uint8_t> b) {
  Reader r(b);
  DrainRequest m;
  const uint8_t on = r.U8("on");
  m.redirect = r.Str("redirect");
  Status st = r.Finish("DRAIN");
  if (!st.ok()) return st;
  if (on > 1) return InvalidArgument("DRAIN: on must be 0 or 1");
  m.on = on == 1;
  if (!m.redirect.empty()) {
    if (Status e = CheckEndpointText(m.redirect, "DRAIN redirect"); !e.ok()) return e;
  }
  return m;
}

void SetLrRequest::EncodeTo(uint8_t* out) const {
  uint32_t bits;
  std::memcpy(&bits, &lr, 4);
  Put32(out, bits);
}
Result<SetLrRequest> SetLrRequest::Decode(std::span<const uint8_t> b) {
  Status s = CheckFixed(b, kWireSize, "SET_LR");
  if (!s.ok()) return s;
  const uint32_t bits = Get32(b.data());
  SetLrRequest r;
  std::memcpy(&r.lr, &bits, 4);
  if (!std::isfinite(r.lr) || r.lr < 0) return InvalidArgument("SET_LR lr ", r.lr, " is not finite and >= 0");
  return r;
}

}  // namespace tessera::paramsvc
