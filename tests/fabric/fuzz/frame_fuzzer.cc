// libFuzzer target for the frame parser: the input is a byte stream as a peer would send it.
// It is parsed as a sequence of frames in both directions, and every accepted frame must
// re-encode to exactly the bytes it was parsed from (the decoders reject anything else, e.g.
// non-zero padding). Built with clang -fsanitize=fuzzer when TESSERA_FUZZ=ON; always built into
// fabric_fuzz_corpus_test, which replays the checked-in corpus (tests/fabric/corpus).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "fabric/wire.h"

namespace {

using namespace tessera::fabric;

template <typename T>
void CheckReencode(const ParsedFrame& f, const uint8_t* frame) {
  std::vector<uint8_t> again = BuildFrame(f.header, std::get<T>(f.body), f.data);
  if (again.size() != f.frame_size || std::memcmp(again.data(), frame, f.frame_size) != 0) {
    std::abort();  // A frame was accepted that does not re-encode identically.
  }
}

void CheckFrame(const ParsedFrame& f, const uint8_t* frame) {
  std::visit(
      [&](const auto& body) {
        using T = std::decay_t<decltype(body)>;
        if constexpr (std::is_same_v<T, std::monostate>) {
          std::vector<uint8_t> again = BuildRawFrame(f.header, f.data);
          if (again.size() != f.frame_size || std::memcmp(again.data(), frame, f.frame_size) != 0) {
            std::abort();
          }
        } else {
          CheckReencode<T>(f, frame);
        }
      },
      f.body);
}

void ParseStream(const uint8_t* data, size_t size, Direction d) {
  size_t off = 0;
  while (off < size) {
    auto f = ParseFrame({data + off, size - off}, d);
    if (!f.ok()) return;  // Need more bytes, or a protocol error: the connection would close.
    if (f->frame_size < kHeaderSize || f->frame_size > size - off) std::abort();
    CheckFrame(*f, data + off);
    off += f->frame_size;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ParseStream(data, size, Direction::kRequest);
  ParseStream(data, size, Direction::kResponse);
  if (size >= kHeaderSize) {
    (void)DecodeHeader({data, kHeaderSize}, Direction::kRequest);
    (void)DecodeHeader({data, kHeaderSize}, Direction::kResponse);
  }
  return 0;
}
