#include "kernel_shim/preload/span_map.h"

#include <algorithm>

namespace tessera::kernel_shim {

void SpanMap::EraseLocked(uintptr_t start, uintptr_t end) {
  auto it = spans_.upper_bound(start);
  if (it != spans_.begin() && std::prev(it)->second.end > start) --it;
  while (it != spans_.end() && it->first < end) {
    const uintptr_t s = it->first, e = it->second.end;
    const int tag = it->second.tag;
    it = spans_.erase(it);
    bytes_[tag] -= e - s;
    if (s < start) {
      spans_.emplace(s, Span{start, tag});
      bytes_[tag] += start - s;
    }
    if (e > end) {
      it = spans_.emplace(end, Span{e, tag}).first;
      bytes_[tag] += e - end;
      ++it;
    }
  }
}

void SpanMap::Set(uintptr_t start, uintptr_t end, int tag) {
  if (end <= start || tag < 0 || tag >= kMaxTags) return;
  std::lock_guard<std::mutex> l(mu_);
  EraseLocked(start, end);
  spans_.emplace(start, Span{end, tag});
  bytes_[tag] += end - start;
  peak_[tag] = std::max(peak_[tag], bytes_[tag]);
}

void SpanMap::Erase(uintptr_t start, uintptr_t end) {
  if (end <= start) return;
  std::lock_guard<std::mutex> l(mu_);
  EraseLocked(start, end);
}

std::vector<SpanMap::Part> SpanMap::Parts(uintptr_t start, uintptr_t end) const {
  std::vector<Part> out;
  if (end <= start) return out;
  std::lock_guard<std::mutex> l(mu_);
  auto it = spans_.upper_bound(start);
  if (it != spans_.begin() && std::prev(it)->second.end > start) --it;
  uintptr_t at = start;
  for (; it != spans_.end() && it->first < end; ++it) {
    const uintptr_t s = std::max(it->first, start), e = std::min(it->second.end, end);
    if (s > at) out.push_back({at, s, kNone});
    out.push_back({s, e, it->second.tag});
    at = e;
  }
  if (at < end) out.push_back({at, end, kNone});
  return out;
}

bool SpanMap::Intersects(uintptr_t start, uintptr_t end) const {
  if (end <= start) return false;
  std::lock_guard<std::mutex> l(mu_);
  auto it = spans_.upper_bound(start);
  if (it != spans_.begin() && std::prev(it)->second.end > start) return true;
  return it != spans_.end() && it->first < end;
}

uint64_t SpanMap::Bytes(int tag) const {
  if (tag < 0 || tag >= kMaxTags) return 0;
  std::lock_guard<std::mutex> l(mu_);
  return bytes_[tag];
}

uint64_t SpanMap::PeakBytes(int tag) const {
  if (tag < 0 || tag >= kMaxTags) return 0;
  std::lock_guard<std::mutex> l(mu_);
  return peak_[tag];
}

}  // namespace tessera::kernel_shim
