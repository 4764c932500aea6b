#include "apps/paramsvc/wire/wire.h"

#include <cmath>
#include <cstring>

#include "common/coding.h"

namespace tessera::paramsvc {
namespace {

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
  SpanWriter(out, kHeaderSize)
      .PutFixed32(kMagic)
      .PutFixed8(kWireVersion)
      .PutFixed8(h.op)
      .PutFixed16(h.status)
      .PutFixed32(h.payload_len)
      .PutFixed32(h.job)
      .PutFixed64(h.request_id);
}

Result<Header> DecodeHeader(std::span<const uint8_t> b) {
  if (b.size() != kHeaderSize) return ProtocolError("header is ", b.size(), " bytes, expected 24");
  SpanReader r(b);
  const uint32_t magic = r.GetFixed32("magic");
  if (magic != kMagic) {
    return ProtocolError("bad magic 0x", std::hex, magic, " (not a paramsvc peer?)");
  }
  const uint8_t version = r.GetFixed8("version");
  if (version != kWireVersion) {
    return ProtocolError("unsupported protocol version ", int{version}, " (this side speaks ",
                         int{kWireVersion}, ")");
  }
  Header h;
  h.op = r.GetFixed8("op");
  h.status = r.GetFixed16("status");
  if (std::strcmp(OpName(h.op), "UNKNOWN") == 0 || (h.op == 0 && h.status == 0)) {
    return ProtocolError("unknown op ", int{h.op});
  }
  h.payload_len = r.GetFixed32("payload length");
  if (h.payload_len > MaxPayload(h.op)) {
    return ProtocolError(OpName(h.op), " payload of ", h.payload_len, " bytes exceeds the limit of ",
                         MaxPayload(h.op));
  }
  h.job = r.GetFixed32("job");
  h.request_id = r.GetFixed64("request id");
  TESSERA_RETURN_IF_ERROR(r.Finish("header"));
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
  ByteWriter w;
  w.PutString16(name);
  w.PutFixed32(workers);
  w.PutFixed8(static_cast<uint8_t>(mode));
  w.PutFixed32(staleness);
  w.PutFixed8(static_cast<uint8_t>(late));
  w.PutFixed8(static_cast<uint8_t>(optimizer.kind));
  w.PutFloat(optimizer.lr);
  w.PutFloat(optimizer.momentum);
  w.PutFloat(optimizer.weight_decay);
  w.PutFloat(optimizer.beta1);
  w.PutFloat(optimizer.beta2);
  w.PutFloat(optimizer.eps);
  w.PutFixed32(partition_bytes);
  w.PutFixed32(static_cast<uint32_t>(tensors.size()));
  for (const TensorSpec& t : tensors) {
    w.PutString16(t.name);
    w.PutFixed8(static_cast<uint8_t>(t.dtype));
    w.PutFixed8(static_cast<uint8_t>(t.shape.size()));
    for (uint64_t d : t.shape) w.PutFixed64(d);
  }
  return w.Take();
}

Result<JobSpec> JobSpec::Decode(std::span<const uint8_t> b) {
  SpanReader r(b);
  JobSpec s;
  s.name = r.GetString16("job name", kMaxNameLength);
  s.workers = r.GetFixed32("workers");
  uint8_t mode = r.GetFixed8("mode");
  if (r.status().ok() && mode > 2) r.Fail(InvalidArgument("unknown consistency mode ", int{mode}));
  s.mode = static_cast<Mode>(mode);
  s.staleness = r.GetFixed32("staleness");
  uint8_t late = r.GetFixed8("late policy");
  if (r.status().ok() && late > 1) r.Fail(InvalidArgument("unknown late policy ", int{late}));
  s.late = static_cast<LatePolicy>(late);
  uint8_t opt = r.GetFixed8("optimizer");
  if (r.status().ok() && opt > 2) r.Fail(InvalidArgument("unknown optimizer ", int{opt}));
  s.optimizer.kind = static_cast<OptimizerKind>(opt);
  s.optimizer.lr = r.GetFloat("lr");
  s.optimizer.momentum = r.GetFloat("momentum");
  s.optimizer.weight_decay = r.GetFloat("weight_decay");
  s.optimizer.beta1 = r.GetFloat("beta1");
  s.optimizer.beta2 = r.GetFloat("beta2");
  s.optimizer.eps = r.GetFloat("eps");
  s.partition_bytes = r.GetFixed32("partition_bytes");
  uint32_t nt = r.GetFixed32("tensor count");
  if (r.status().ok() && (nt == 0 || nt > kMaxTensors)) {
    r.Fail(InvalidArgument("tensor count ", nt, " not in 1..", kMaxTensors));
  }
  for (uint32_t i = 0; r.status().ok() && i < nt; ++i) {
    TensorSpec t;
    t.name = r.GetString16("tensor name", kMaxNameLength);
    uint8_t d = r.GetFixed8("dtype");
    if (r.status().ok()) r.Fail(CheckDType(d, "tensor"));
    t.dtype = static_cast<DType>(d);
    uint8_t nd = r.GetFixed8("ndims");
    if (r.status().ok() && (nd == 0 || nd > 8)) {
      r.Fail(InvalidArgument("tensor '", t.name, "' has ", int{nd}, " dims (1..8)"));
    }
    for (uint8_t k = 0; r.status().ok() && k < nd; ++k) t.shape.push_back(r.GetFixed64("dim"));
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
  ByteWriter w;
  w.PutFixed32(job);
  w.PutFixed32(static_cast<uint32_t>(partitions.size()));
  for (const auto& p : partitions) {
    w.PutFixed32(p.tensor);
    w.PutFixed64(p.offset);
    w.PutFixed32(p.count);
  }
  return w.Take();
}

Result<JobLayout> JobLayout::Decode(std::span<const uint8_t> b) {
  SpanReader r(b);
  JobLayout l;
  l.job = r.GetFixed32("job");
  uint32_t n = r.GetFixed32("partition count");
  if (r.status().ok() && n > (b.size() / 16)) r.Fail(ProtocolError("partition count ", n, " too large"));
  for (uint32_t i = 0; r.status().ok() && i < n; ++i) {
    PartitionInfo p;
    p.tensor = r.GetFixed32("tensor");
    p.offset = r.GetFixed64("offset");
    p.count = r.GetFixed32("count");
    l.partitions.push_back(p);
  }
  Status st = r.Finish("layout");
  if (!st.ok()) return st;
  return l;
}

void PushRequest::EncodeFixed(uint8_t* out) const {
  SpanWriter(out, kFixed)
      .PutFixed32(worker)
      .PutFixed32(partition)
      .PutFixed64(version)
      .PutFixed8(static_cast<uint8_t>(dtype))
      .PutZeros(3)
      .PutFixed32(count);
}

namespace {
// A dtype byte and its three zero padding bytes, as PUSH, PULL and SET_PARAMS carry them.
Result<DType> GetDTypeAndPadding(SpanReader* r, const char* what) {
  const uint8_t d = r->GetFixed8("dtype");
  const auto pad = r->GetBytes(3, "padding");
  TESSERA_RETURN_IF_ERROR(r->status());
  TESSERA_RETURN_IF_ERROR(CheckDType(d, what));
  if (pad[0] | pad[1] | pad[2]) return ProtocolError(what, " padding is not zero");
  return static_cast<DType>(d);
}
}  // namespace

Result<PushRequest> PushRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() < kFixed) return ProtocolError("PUSH is ", b.size(), " bytes, at least ", kFixed);
  PushRequest p;
  SpanReader r(b);
  p.worker = r.GetFixed32("worker");
  p.partition = r.GetFixed32("partition");
  p.version = r.GetFixed64("version");
  auto dtype = GetDTypeAndPadding(&r, "PUSH");
  if (!dtype.ok()) return dtype.status();
  p.dtype = *dtype;
  p.count = r.GetFixed32("count");
  const uint64_t want = static_cast<uint64_t>(p.count) * DTypeSize(p.dtype);
  if (b.size() - kFixed != want) {
    return InvalidArgument("PUSH of ", p.count, " ", DTypeName(p.dtype), " elements carries ",
                           b.size() - kFixed, " data bytes, expected ", want);
  }
  p.data = b.subspan(kFixed);
  return p;
}

void PushReply::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize)
      .PutFixed8(static_cast<uint8_t>(outcome))
      .PutZeros(3)
      .PutFixed32(staleness)
      .PutFixed64(version);
}

Result<PushReply> PushReply::Decode(std::span<const uint8_t> b) {
  Status s = CheckFixed(b, kWireSize, "PUSH reply");
  if (!s.ok()) return s;
  SpanReader in(b);
  const uint8_t outcome = in.GetFixed8("outcome");
  if (outcome > 3) return ProtocolError("PUSH reply: unknown outcome ", int{outcome});
  in.Skip(3, "padding");
  PushReply r;
  r.outcome = static_cast<PushOutcome>(outcome);
  r.staleness = in.GetFixed32("staleness");
  r.version = in.GetFixed64("version");
  TESSERA_RETURN_IF_ERROR(in.Finish("PUSH reply"));
  return r;
}

void PullRequest::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize)
      .PutFixed32(partition)
      .PutFixed8(static_cast<uint8_t>(dtype))
      .PutZeros(3)
      .PutFixed64(min_version)
      .PutFixed32(timeout_ms);
}

Result<PullRequest> PullRequest::Decode(std::span<const uint8_t> b) {
  Status s = CheckFixed(b, kWireSize, "PULL");
  if (!s.ok()) return s;
  PullRequest p;
  SpanReader r(b);
  p.partition = r.GetFixed32("partition");
  auto dtype = GetDTypeAndPadding(&r, "PULL");
  if (!dtype.ok()) return dtype.status();
  p.dtype = *dtype;
  p.min_version = r.GetFixed64("min_version");
  p.timeout_ms = r.GetFixed32("timeout_ms");
  TESSERA_RETURN_IF_ERROR(r.Finish("PULL"));
  if (p.timeout_ms > 600000) return InvalidArgument("PULL timeout_ms ", p.timeout_ms, " above 600000");
  return p;
}

Result<PullReply> PullReply::Decode(std::span<const uint8_t> b) {
  if (b.size() < kFixed) return ProtocolError("PULL reply is ", b.size(), " bytes");
  PullReply r;
  SpanReader in(b);
  r.version = in.GetFixed64("version");
  r.count = in.GetFixed32("count");
  const uint8_t dtype = in.GetFixed8("dtype");
  TESSERA_RETURN_IF_ERROR(CheckDType(dtype, "PULL reply"));
  r.dtype = static_cast<DType>(dtype);
  if (b.size() - kFixed != static_cast<uint64_t>(r.count) * DTypeSize(r.dtype)) {
    return ProtocolError("PULL reply data size does not match its count");
  }
  r.data = b.subspan(kFixed);
  return r;
}

void BarrierRequest::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize).PutFixed32(worker).PutFixed32(timeout_ms).PutFixed64(iteration);
}

Result<BarrierRequest> BarrierRequest::Decode(std::span<const uint8_t> b) {
  Status s = CheckFixed(b, kWireSize, "BARRIER");
  if (!s.ok()) return s;
  BarrierRequest r;
  SpanReader in(b);
  r.worker = in.GetFixed32("worker");
  r.timeout_ms = in.GetFixed32("timeout_ms");
  r.iteration = in.GetFixed64("iteration");
  TESSERA_RETURN_IF_ERROR(in.Finish("BARRIER"));
  if (r.timeout_ms > 600000) return InvalidArgument("BARRIER timeout_ms ", r.timeout_ms, " above 600000");
  return r;
}

void SetParamsRequest::EncodeFixed(uint8_t* out) const {
  SpanWriter(out, kFixed)
      .PutFixed32(partition)
      .PutFixed8(static_cast<uint8_t>(dtype))
      .PutZeros(3)
      .PutFixed32(count);
}

Result<SetParamsRequest> SetParamsRequest::Decode(std::span<const uint8_t> b) {
  if (b.size() < kFixed) return ProtocolError("SET_PARAMS is ", b.size(), " bytes");
  SetParamsRequest p;
  SpanReader r(b);
  p.partition = r.GetFixed32("partition");
  auto dtype = GetDTypeAndPadding(&r, "SET_PARAMS");
  if (!dtype.ok()) return dtype.status();
  p.dtype = *dtype;
  p.count = r.GetFixed32("count");
  if (b.size() - kFixed != static_cast<uint64_t>(p.count) * DTypeSize(p.dtype)) {
    return InvalidArgument("SET_PARAMS of ", p.count, " elements carries ", b.size() - kFixed,
                           " data bytes");
  }
  p.data = b.subspan(kFixed);
  return p;
}

void MigrateRequest::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize).PutFixed32(partition).PutFixed32(core);
}
Result<MigrateRequest> MigrateRequest::Decode(std::span<const uint8_t> b) {
  Status s = CheckFixed(b, kWireSize, "MIGRATE");
  if (!s.ok()) return s;
  SpanReader r(b);
  MigrateRequest m;
  m.partition = r.GetFixed32("partition");
  m.core = r.GetFixed32("core");
  TESSERA_RETURN_IF_ERROR(r.Finish("MIGRATE"));
  return m;
}

void CoresRequest::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize).PutFixed32(max_cores).PutFixed32(elastic);
}
Result<CoresRequest> CoresRequest::Decode(std::span<const uint8_t> b) {
  Status s = CheckFixed(b, kWireSize, "CORES");
  if (!s.ok()) return s;
  SpanReader in(b);
  CoresRequest r;
  r.max_cores = in.GetFixed32("max_cores");
  r.elastic = in.GetFixed32("elastic");
  TESSERA_RETURN_IF_ERROR(in.Finish("CORES"));
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
  ByteWriter w;
  w.PutString16(job);
  w.PutString16(to);
  w.PutFixed32(boundary_timeout_ms);
  w.PutFixed8(allow_volatile ? 1 : 0);
  return w.Take();
}

Result<MoveJobRequest> MoveJobRequest::Decode(std::span<const uint8_t> b) {
  SpanReader r(b);
  MoveJobRequest m;
  m.job = r.GetString16("job name", kMaxNameLength);
  m.to = r.GetString16("destination", kMaxNameLength);
  m.boundary_timeout_ms = r.GetFixed32("boundary_timeout_ms");
  const uint8_t flags = r.GetFixed8("flags");
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
  ByteWriter w;
  w.PutFixed64(move_id);
  w.PutString16(source);
  std::vector<uint8_t> out = w.Take();
  const auto sp = spec.Encode();
  out.insert(out.end(), sp.begin(), sp.end());
  return out;
}

Result<ImportBegin> ImportBegin::Decode(std::span<const uint8_t> b) {
  SpanReader r(b);
  ImportBegin m;
  m.move_id = r.GetFixed64("move id");
  m.source = r.GetString16("source", kMaxNameLength);
  if (!r.status().ok()) return r.status();
  if (m.move_id == 0) return InvalidArgument("IMPORT_BEGIN: move id 0");
  if (Status e = CheckEndpointText(m.source, "IMPORT_BEGIN source"); !e.ok()) return e;
  auto spec = JobSpec::Decode(b.subspan(r.pos()));
  if (!spec.ok()) return spec.status();
  m.spec = std::move(*spec);
  return m;
}

std::vector<uint8_t> ImportPart::EncodeFixed(uint64_t move_id, uint32_t partition,
                                             uint32_t state_len) {
  ByteWriter w;
  w.PutFixed64(move_id).PutFixed32(partition).PutFixed32(state_len);
  return w.Take();
}

Result<ImportPart> ImportPart::Decode(std::span<const uint8_t> b) {
  if (b.size() < 16) return ProtocolError("IMPORT_PART is ", b.size(), " bytes, at least 16");
  ImportPart m;
  SpanReader r(b);
  m.move_id = r.GetFixed64("move id");
  m.partition = r.GetFixed32("partition");
  const uint32_t len = r.GetFixed32("state length");
  if (r.left() < len) {
    return ProtocolError("IMPORT_PART: a state of ", len, " bytes in ", r.left());
  }
  m.state = r.GetBytes(len, "state");
  m.counters = r.Rest();
  return m;
}

void ImportPrepare::EncodeTo(uint8_t* out) const {
  SpanWriter(out, kWireSize).PutFixed64(move_id).PutFloat(lr).PutFixed64(moves);
}

Result<ImportPrepare> ImportPrepare::Decode(std::span<const uint8_t> b) {
  Status s = CheckFixed(b, kWireSize, "IMPORT_PREPARE");
  if (!s.ok()) return s;
  ImportPrepare m;
  SpanReader r(b);
  m.move_id = r.GetFixed64("move id");
  m.lr = r.GetFloat("lr");
  m.moves = r.GetFixed64("moves");
  TESSERA_RETURN_IF_ERROR(r.Finish("IMPORT_PREPARE"));
  if (!std::isfinite(m.lr) || m.lr < 0) return InvalidArgument("IMPORT_PREPARE lr ", m.lr);
  return m;
}

std::vector<uint8_t> MoveRef::Encode() const {
  ByteWriter w;
  w.PutFixed64(move_id);
  w.PutString16(job);
  return w.Take();
}

Result<MoveRef> MoveRef::Decode(std::span<const uint8_t> b) {
  SpanReader r(b);
  MoveRef m;
  m.move_id = r.GetFixed64("move id");
  m.job = r.GetString16("job name", kMaxNameLength);
  Status st = r.Finish("move reference");
  if (!st.ok()) return st;
  if (m.move_id == 0 || m.job.empty()) return InvalidArgument("move reference without an id or a job");
  return m;
}

std::vector<uint8_t> DrainRequest::Encode() const {
  ByteWriter w;
  w.PutFixed8(on ? 1 : 0);
  w.PutString16(redirect);
  return w.Take();
}

Result<DrainRequest> DrainRequest::Decode(std::span<const uint8_t> b) {
  SpanReader r(b);
  DrainRequest m;
  const uint8_t on = r.GetFixed8("on");
  m.redirect = r.GetString16("redirect", kMaxNameLength);
  Status st = r.Finish("DRAIN");
  if (!st.ok()) return st;
  if (on > 1) return InvalidArgument("DRAIN: on must be 0 or 1");
  m.on = on == 1;
  if (!m.redirect.empty()) {
    if (Status e = CheckEndpointText(m.redirect, "DRAIN redirect"); !e.ok()) return e;
  }
  return m;
}

void SetLrRequest::EncodeTo(uint8_t* out) const { SpanWriter(out, kWireSize).PutFloat(lr); }
Result<SetLrRequest> SetLrRequest::Decode(std::span<const uint8_t> b) {
  Status s = CheckFixed(b, kWireSize, "SET_LR");
  if (!s.ok()) return s;
  SpanReader in(b);
  SetLrRequest r;
  r.lr = in.GetFloat("lr");
  TESSERA_RETURN_IF_ERROR(in.Finish("SET_LR"));
  if (!std::isfinite(r.lr) || r.lr < 0) return InvalidArgument("SET_LR lr ", r.lr, " is not finite and >= 0");
  return r;
}

}  // namespace tessera::paramsvc
