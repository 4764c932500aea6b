#include "memserver/fault_state.h"

#include <charconv>
#include <cstdio>

#include "common/units.h"

namespace tessera::memserver {
namespace {

constexpr uint32_t kDefaultMask = (1u << op_bits::kRead) | (1u << op_bits::kWrite);
// Bounds that keep a mistyped command from wedging a server for days or spinning on flips.
constexpr uint64_t kMaxDelayNs = 60ull * 1000000000ull;
constexpr uint64_t kMaxFlips = 1u << 20;
constexpr uint64_t kMaxEvict = 1u << 20;

struct OpName {
  const char* name;
  uint16_t op;
};
constexpr OpName kOpNames[] = {
    {"alloc", op_bits::kAllocSlab}, {"free", op_bits::kFreeSlab},
    {"read", op_bits::kRead},       {"write", op_bits::kWrite},
    {"stats", op_bits::kStats},     {"heartbeat", op_bits::kHeartbeat},
    {"invoke", op_bits::kInvoke},
};

Result<uint64_t> ParseCount(std::string_view what, std::string_view s) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) {
    return InvalidArgument("bad ", what, " '", s, "' (expected a non-negative integer)");
  }
  return v;
}

}  // namespace

std::string_view FaultKindName(FaultKind k) {
  switch (k) {
    case FaultKind::kClear: return "clear";
    case FaultKind::kDelay: return "delay";
    case FaultKind::kHang: return "hang";
    case FaultKind::kDrop: return "drop";
    case FaultKind::kCrash: return "crash";
    case FaultKind::kBitFlip: return "bitflip";
    case FaultKind::kRefuseAlloc: return "refuse-alloc";
    case FaultKind::kEvict: return "evict";
  }
  return "unknown";
}

Result<uint32_t> ParseOpMask(std::string_view ops) {
  uint32_t mask = 0;
  size_t pos = 0;
  while (pos <= ops.size()) {
    size_t comma = ops.find(',', pos);
    std::string_view word = ops.substr(pos, comma == std::string_view::npos ? ops.npos : comma - pos);
    bool found = false;
    for (const OpName& o : kOpNames) {
      if (word == o.name) {
        mask |= 1u << o.op;
        found = true;
      }
    }
    if (!found) {
      return InvalidArgument("unknown op '", word,
                             "' (ops: alloc, free, read, write, stats, heartbeat, invoke)");
    }
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return mask;
}

Status ValidateFaultSpec(const FaultSpec& s) {
  switch (s.kind) {
    case FaultKind::kDelay:
      if (s.delay_ns == 0) return InvalidArgument("delay needs a positive duration");
      if (s.delay_ns > kMaxDelayNs) return InvalidArgument("delay is capped at 60s");
      break;
    case FaultKind::kBitFlip:
      if (s.count == 0 || s.count > kMaxFlips) {
        return InvalidArgument("bitflip count must be in [1, ", kMaxFlips, "], got ", s.count);
      }
      break;
    case FaultKind::kEvict:
      if (s.count == 0 || s.count > kMaxEvict) {
        return InvalidArgument("evict count must be in [1, ", kMaxEvict, "], got ", s.count);
      }
      break;
    default:
      break;
  }
  if (s.op_mask & (1u << op_bits::kFault)) {
    return InvalidArgument("FAULT itself cannot be faulted (so that 'clear' always works)");
  }
  constexpr uint32_t kAllowed = (1u << 16) - 1;
  if (s.op_mask & ~kAllowed) return InvalidArgument("op mask has unknown ops: ", s.op_mask);
  return Status::Ok();
}

Result<FaultSpec> ParseFaultCommand(std::span<const std::string> words, std::string_view ops,
                                    std::string_view duration) {
  if (words.empty()) return InvalidArgument("missing fault action");
  const std::string& a = words[0];
  FaultSpec spec;
  size_t want_args = 0;
  size_t max_args = 0;
  if (a == "clear") {
    spec.kind = FaultKind::kClear;
  } else if (a == "delay") {
    spec.kind = FaultKind::kDelay;
    want_args = max_args = 1;
  } else if (a == "hang") {
    spec.kind = FaultKind::kHang;
  } else if (a == "drop") {
    spec.kind = FaultKind::kDrop;
  } else if (a == "crash") {
    spec.kind = FaultKind::kCrash;
  } else if (a == "bitflip") {
    spec.kind = FaultKind::kBitFlip;
    want_args = 1;
    max_args = 2;
  } else if (a == "refuse-alloc") {
    spec.kind = FaultKind::kRefuseAlloc;
  } else if (a == "evict") {
    spec.kind = FaultKind::kEvict;
    want_args = max_args = 1;
  } else {
    return InvalidArgument("unknown fault action '", a,
                           "' (clear, delay, hang, drop, crash, bitflip, refuse-alloc, evict)");
  }
  size_t nargs = words.size() - 1;
  if (nargs < want_args || nargs > max_args) {
    return InvalidArgument("'", a, "' takes ", want_args == max_args ? "" : "at least ",
                           want_args, " argument(s), got ", nargs);
  }
  if (spec.kind == FaultKind::kDelay) {
    TESSERA_ASSIGN_OR_RETURN(spec.delay_ns, ParseDurationNs(words[1]));
  }
  if (spec.kind == FaultKind::kBitFlip || spec.kind == FaultKind::kEvict) {
    TESSERA_ASSIGN_OR_RETURN(spec.count, ParseCount("count", words[1]));
  }
  if (spec.kind == FaultKind::kBitFlip && nargs == 2) {
    TESSERA_ASSIGN_OR_RETURN(spec.slab_id, ParseCount("slab id", words[2]));
    if (spec.slab_id == 0) return InvalidArgument("slab id 0 names no slab");
  }
  bool persistent = spec.kind == FaultKind::kDelay || spec.kind == FaultKind::kHang ||
                    spec.kind == FaultKind::kDrop;
  if (!ops.empty()) {
    if (!persistent) return InvalidArgument("--ops applies to delay, hang and drop only");
    TESSERA_ASSIGN_OR_RETURN(spec.op_mask, ParseOpMask(ops));
  }
  if (!duration.empty()) {
    if (!persistent && spec.kind != FaultKind::kRefuseAlloc) {
      return InvalidArgument("--duration applies to delay, hang, drop and refuse-alloc only");
    }
    TESSERA_ASSIGN_OR_RETURN(spec.duration_ns, ParseDurationNs(duration));
    if (spec.duration_ns == 0) return InvalidArgument("--duration must be positive");
  }
  TESSERA_RETURN_IF_ERROR(ValidateFaultSpec(spec));
  return spec;
}

Status FaultState::Apply(const FaultSpec& spec, uint64_t now_ns) {
  TESSERA_RETURN_IF_ERROR(ValidateFaultSpec(spec));
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t until = spec.duration_ns == 0 ? UINT64_MAX
                   : now_ns > UINT64_MAX - spec.duration_ns ? UINT64_MAX
                                                            : now_ns + spec.duration_ns;
  uint32_t mask = spec.op_mask == 0 ? kDefaultMask : spec.op_mask;
  switch (spec.kind) {
    case FaultKind::kClear:
      delay_ = hang_ = drop_ = refuse_alloc_ = Rule{};
      delay_ns_ = 0;
      break;
    case FaultKind::kDelay:
      delay_ = Rule{true, until, mask};
      delay_ns_ = spec.delay_ns;
      break;
    case FaultKind::kHang:
      hang_ = Rule{true, until, mask};
      break;
    case FaultKind::kDrop:
      drop_ = Rule{true, until, mask};
      break;
    case FaultKind::kRefuseAlloc:
      refuse_alloc_ = Rule{true, until, 1u << op_bits::kAllocSlab};
      break;
    default:
      return InvalidArgument("'", FaultKindName(spec.kind),
                             "' is a one-shot action, not a fault state");
  }
  RecomputeActiveLocked();
  return Status::Ok();
}

void FaultState::RecomputeActiveLocked() {
  any_.store(delay_.on || hang_.on || drop_.on || refuse_alloc_.on, std::memory_order_release);
}

FaultState::Decision FaultState::Decide(uint16_t op, uint64_t now_ns) {
  Decision d;
  if (!any_.load(std::memory_order_acquire)) return d;
  if (op == op_bits::kFault || op >= 32) return d;
  std::lock_guard<std::mutex> lock(mu_);
  uint32_t bit = 1u << op;
  if (delay_.Active(now_ns) && (delay_.op_mask & bit)) d.delay_ns = delay_ns_;
  if (hang_.Active(now_ns) && (hang_.op_mask & bit)) d.hang = true;
  if (drop_.Active(now_ns) && (drop_.op_mask & bit)) d.drop = true;
  // Expired rules switch themselves off, so the fast path goes back to one load.
  for (Rule* r : {&delay_, &hang_, &drop_, &refuse_alloc_}) {
    if (r->on && now_ns >= r->until_ns) *r = Rule{};
  }
  RecomputeActiveLocked();
  return d;
}

bool FaultState::RefuseAlloc(uint64_t now_ns) {
  if (!any_.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return refuse_alloc_.Active(now_ns);
}

std::string FaultState::Describe(uint64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  auto add = [&](const char* name, const Rule& r, const std::string& extra) {
    if (!r.Active(now_ns)) return;
    if (!out.empty()) out += "; ";
    char mask[24];
    std::snprintf(mask, sizeof(mask), "0x%x", r.op_mask);
    out += name + extra;
    if (r.op_mask != (1u << op_bits::kAllocSlab) || std::string_view(name) != "refuse-alloc") {
      out += std::string(" ops=") + mask;
    }
    if (r.until_ns != UINT64_MAX) {
      // Whole milliseconds left, rounded up, so "for=1s" rather than "for=999.9ms".
      uint64_t ms = (r.until_ns - now_ns + 999999) / 1000000;
      out += " for=" + FormatDurationNs(ms * 1000000);
    }
  };
  add("delay", delay_, "=" + FormatDurationNs(delay_ns_));
  add("hang", hang_, "");
  add("drop", drop_, "");
  add("refuse-alloc", refuse_alloc_, "");
  return out.empty() ? "none" : out;
}

}  // namespace tessera::memserver

namespace tessera::memserver {
namespace {
void Put(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t Get(std::string_view in, size_t off, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(in[off + i]);
  return v;
}
}  // namespace

std::string EncodeFaultSpec(const FaultSpec& s) {
  std::string out;
  out.reserve(kFaultSpecWireSize);
  Put(&out, static_cast<uint32_t>(s.kind), 4);
  Put(&out, s.op_mask, 4);
  Put(&out, s.delay_ns, 8);
  Put(&out, s.duration_ns, 8);
  Put(&out, s.count, 8);
  Put(&out, s.slab_id, 8);
  return out;
}

Result<FaultSpec> DecodeFaultSpec(std::string_view b) {
  if (b.size() != kFaultSpecWireSize) {
    return InvalidArgument("fault spec must be ", kFaultSpecWireSize, " bytes, got ", b.size());
  }
  FaultSpec s;
  uint64_t kind = Get(b, 0, 4);
  if (kind > static_cast<uint32_t>(FaultKind::kEvict)) {
    return InvalidArgument("unknown fault kind ", kind);
  }
  s.kind = static_cast<FaultKind>(kind);
  s.op_mask = static_cast<uint32_t>(Get(b, 4, 4));
  s.delay_ns = Get(b, 8, 8);
  s.duration_ns = Get(b, 16, 8);
  s.count = Get(b, 24, 8);
  s.slab_id = Get(b, 32, 8);
  TESSERA_RETURN_IF_ERROR(ValidateFaultSpec(s));
  return s;
}

}  // namespace tessera::memserver
