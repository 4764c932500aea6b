// Little-endian fixed-width encoding, in the style of leveldb's coding.h: the byte helpers
// (EncodeFixed32 / DecodeFixed32 on a pointer) and two cursors, so that a wire struct is
// written and read field by field in order instead of at literal offsets.
//
//   SpanWriter w(out);                    // a caller's buffer of the struct's wire size
//   w.PutFixed32(worker).PutFixed64(version).PutZeros(3);
//
//   SpanReader r(bytes);                  // records the first error, naming the field
//   uint32_t worker = r.GetFixed32("worker");
//   TESSERA_RETURN_IF_ERROR(r.Finish("PUSH"));  // also refuses trailing bytes
//
// ByteWriter appends to a std::vector<uint8_t> (variable-length messages).
//
// Every protocol of Tessera's own is little-endian. The BigEndian variants (network order)
// serve the protocols that define it so (NBD).
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tessera {

inline void EncodeFixed16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
inline void EncodeFixed32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline void EncodeFixed64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint16_t DecodeFixed16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
inline uint32_t DecodeFixed32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
inline uint64_t DecodeFixed64(const uint8_t* p) {
  return static_cast<uint64_t>(DecodeFixed32(p)) |
         (static_cast<uint64_t>(DecodeFixed32(p + 4)) << 32);
}

inline void EncodeBigEndian16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
inline void EncodeBigEndian32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * (3 - i)));
}
inline void EncodeBigEndian64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * (7 - i)));
}
inline uint16_t DecodeBigEndian16(const uint8_t* p) {
  return static_cast<uint16_t>((p[0] << 8) | p[1]);
}
inline uint32_t DecodeBigEndian32(const uint8_t* p) {
  return (static_cast<uint32_t>(p[0]) << 24) | (static_cast<uint32_t>(p[1]) << 16) |
         (static_cast<uint32_t>(p[2]) << 8) | static_cast<uint32_t>(p[3]);
}
inline uint64_t DecodeBigEndian64(const uint8_t* p) {
  return (static_cast<uint64_t>(DecodeBigEndian32(p)) << 32) | DecodeBigEndian32(p + 4);
}

// The bytes of a string (a label, a secret) as written to the wire or hashed.
inline std::span<const uint8_t> AsBytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// Writes fields in order into a buffer whose size the caller knows (a struct's wire size).
// Writing past its end is a programming error: it aborts.
class SpanWriter {
 public:
  explicit SpanWriter(std::span<uint8_t> out) : p_(out.data()), end_(out.data() + out.size()) {}
  SpanWriter(uint8_t* out, size_t size) : p_(out), end_(out + size) {}
  // Grows `out` by `size` bytes (zeros) and writes over them: a record of known size appended
  // after those already in a buffer.
  static SpanWriter AppendTo(std::vector<uint8_t>& out, size_t size) {
    out.resize(out.size() + size);
    return SpanWriter(out.data() + out.size() - size, size);
  }
  SpanWriter& PutFixed8(uint8_t v) {
    *Take(1) = v;
    return *this;
  }
  SpanWriter& PutFixed16(uint16_t v) {
    EncodeFixed16(Take(2), v);
    return *this;
  }
  SpanWriter& PutFixed32(uint32_t v) {
    EncodeFixed32(Take(4), v);
    return *this;
  }
  SpanWriter& PutFixed64(uint64_t v) {
    EncodeFixed64(Take(8), v);
    return *this;
  }
  SpanWriter& PutFloat(float f) {
    uint32_t v;
    std::memcpy(&v, &f, 4);
    return PutFixed32(v);
  }
  SpanWriter& PutBytes(std::span<const uint8_t> b) {
    if (!b.empty()) std::memcpy(Take(b.size()), b.data(), b.size());
    return *this;
  }
  SpanWriter& PutZeros(size_t n) {
    std::memset(Take(n), 0, n);
    return *this;
  }
  size_t left() const { return static_cast<size_t>(end_ - p_); }

 private:
  uint8_t* Take(size_t n);
  uint8_t* p_;
  uint8_t* end_;
};

// Appends fields to a byte vector.
class ByteWriter {
 public:
  ByteWriter& PutFixed8(uint8_t v) {
    b_.push_back(v);
    return *this;
  }
  ByteWriter& PutFixed16(uint16_t v) {
    EncodeFixed16(Grow(2), v);
    return *this;
  }
  ByteWriter& PutFixed32(uint32_t v) {
    EncodeFixed32(Grow(4), v);
    return *this;
  }
  ByteWriter& PutFixed64(uint64_t v) {
    EncodeFixed64(Grow(8), v);
    return *this;
  }
  ByteWriter& PutFloat(float f) {
    uint32_t v;
    std::memcpy(&v, &f, 4);
    return PutFixed32(v);
  }
  ByteWriter& PutBytes(std::span<const uint8_t> b) {
    b_.insert(b_.end(), b.begin(), b.end());
    return *this;
  }
  ByteWriter& PutBigEndian16(uint16_t v) {
    EncodeBigEndian16(Grow(2), v);
    return *this;
  }
  ByteWriter& PutBigEndian32(uint32_t v) {
    EncodeBigEndian32(Grow(4), v);
    return *this;
  }
  ByteWriter& PutBigEndian64(uint64_t v) {
    EncodeBigEndian64(Grow(8), v);
    return *this;
  }
  ByteWriter& PutBytes(std::string_view s) { return PutBytes(AsBytes(s)); }
  // A 16-bit length, then the bytes (the caller bounds the length).
  ByteWriter& PutString16(std::string_view s) {
    PutFixed16(static_cast<uint16_t>(s.size()));
    b_.insert(b_.end(), s.begin(), s.end());
    return *this;
  }
  size_t size() const { return b_.size(); }
  std::vector<uint8_t> Take() { return std::move(b_); }
  std::string TakeString() {
    std::string s(b_.begin(), b_.end());
    b_.clear();
    return s;
  }

 private:
  uint8_t* Grow(size_t n) {
    b_.resize(b_.size() + n);
    return b_.data() + b_.size() - n;
  }
  std::vector<uint8_t> b_;
};

// Reads fields in order from bytes that came off the wire. The first field that does not fit
// sets a ProtocolError naming it; every later read returns 0 (or empty) and the error stays.
class SpanReader {
 public:
  explicit SpanReader(std::span<const uint8_t> b) : b_(b) {}
  uint8_t GetFixed8(const char* what) { return Need(1, what) ? b_[pos_++] : 0; }
  uint16_t GetFixed16(const char* what) {
    if (!Need(2, what)) return 0;
    pos_ += 2;
    return DecodeFixed16(b_.data() + pos_ - 2);
  }
  uint32_t GetFixed32(const char* what) {
    if (!Need(4, what)) return 0;
    pos_ += 4;
    return DecodeFixed32(b_.data() + pos_ - 4);
  }
  uint64_t GetFixed64(const char* what) {
    if (!Need(8, what)) return 0;
    pos_ += 8;
    return DecodeFixed64(b_.data() + pos_ - 8);
  }
  uint16_t GetBigEndian16(const char* what) {
    if (!Need(2, what)) return 0;
    pos_ += 2;
    return DecodeBigEndian16(b_.data() + pos_ - 2);
  }
  uint32_t GetBigEndian32(const char* what) {
    if (!Need(4, what)) return 0;
    pos_ += 4;
    return DecodeBigEndian32(b_.data() + pos_ - 4);
  }
  uint64_t GetBigEndian64(const char* what) {
    if (!Need(8, what)) return 0;
    pos_ += 8;
    return DecodeBigEndian64(b_.data() + pos_ - 8);
  }
  float GetFloat(const char* what) {
    const uint32_t v = GetFixed32(what);
    float f;
    std::memcpy(&f, &v, 4);
    return f;
  }
  // n bytes, in place (empty on error).
  std::span<const uint8_t> GetBytes(size_t n, const char* what) {
    if (!Need(n, what)) return {};
    pos_ += n;
    return b_.subspan(pos_ - n, n);
  }
  // A 16-bit length, then that many bytes; InvalidArgument past max_len.
  std::string GetString16(const char* what, size_t max_len);
  void Skip(size_t n, const char* what) { (void)GetBytes(n, what); }
  // Everything not read yet (and the cursor moves to the end).
  std::span<const uint8_t> Rest() {
    auto r = b_.subspan(pos_);
    pos_ = b_.size();
    return r;
  }
  void Fail(Status s) {
    if (err_.ok()) err_ = std::move(s);
  }
  // The first error, else ProtocolError when bytes are left over ("MSG: N trailing bytes").
  Status Finish(const char* msg);
  size_t pos() const { return pos_; }
  size_t left() const { return b_.size() - pos_; }
  bool ok() const { return err_.ok(); }
  const Status& status() const { return err_; }

 private:
  bool Need(size_t n, const char* what);
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
  Status err_;
};

}  // namespace tessera
