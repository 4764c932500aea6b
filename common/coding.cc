#include "common/coding.h"

#include <cstdio>
#include <cstdlib>

namespace tessera {

uint8_t* SpanWriter::Take(size_t n) {
  if (static_cast<size_t>(end_ - p_) < n) {
    std::fprintf(stderr, "SpanWriter: writing %zu bytes with %zu left (a wire size is wrong)\n", n,
                 static_cast<size_t>(end_ - p_));
    std::abort();
  }
  uint8_t* p = p_;
  p_ += n;
  return p;
}

bool SpanReader::Need(size_t n, const char* what) {
  if (!err_.ok()) return false;
  if (b_.size() - pos_ < n) {
    err_ = ProtocolError("truncated message: ", what, " needs ", n, " bytes, ", b_.size() - pos_,
                         " left");
    return false;
  }
  return true;
}

std::string SpanReader::GetString16(const char* what, size_t max_len) {
  const uint16_t n = GetFixed16(what);
  if (n > max_len) {
    Fail(InvalidArgument(what, " is ", n, " bytes (at most ", max_len, ")"));
    return {};
  }
  auto b = GetBytes(n, what);
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

Status SpanReader::Finish(const char* msg) {
  if (err_.ok() && pos_ != b_.size()) {
    err_ = ProtocolError(msg, ": ", b_.size() - pos_, " trailing bytes");
  }
  return err_;
}

}  // namespace tessera
