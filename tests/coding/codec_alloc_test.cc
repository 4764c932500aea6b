// The Codec fast path allocates nothing: operator new is replaced in this test executable to
// count allocations made by the calling thread while Encode/Reconstruct run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <new>
#include <random>
#include <vector>

#include "coding/codec.h"

namespace {
thread_local long g_allocations = 0;
}  // namespace

void* operator new(std::size_t n) {
  ++g_allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  ++g_allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace tessera::coding {
namespace {

TEST(CodecAllocTest, EncodeAndReconstructDoNotAllocate) {
  {  // The counting hook is live in this executable.
    const long before = g_allocations;
    auto probe = std::make_unique<std::vector<int>>(16);
    ASSERT_GE(g_allocations - before, 2) << "operator new replacement not in effect";
  }
  // RS(8,2) and RS(16,4) are fully eager; RS(32,4) levels 3 and 4 use the on-stack path.
  for (auto [k, r] : std::vector<std::pair<int, int>>{{8, 2}, {16, 4}, {32, 4}}) {
    auto c = Codec::Create(k, r);
    ASSERT_TRUE(c.ok()) << c.status();
    const size_t ss = c->split_size();
    std::vector<uint8_t> page(kPageSize), out(kPageSize);
    std::mt19937_64 rng(k);
    for (auto& b : page) b = static_cast<uint8_t>(rng());
    std::vector<std::vector<uint8_t>> parity(r, std::vector<uint8_t>(ss));
    std::vector<uint8_t*> pp;
    for (auto& p : parity) pp.push_back(p.data());
    std::vector<uint32_t> crcs(k + r);
    std::vector<const uint8_t*> splits;
    for (int i = 0; i < k; ++i) splits.push_back(page.data() + i * ss);
    for (auto& p : parity) splits.push_back(p.data());

    const long before = g_allocations;
    c->EncodeWithCrcs(page.data(), pp.data(), crcs.data());
    bool all_ok = true;
    for (int lost = 0; lost <= r; ++lost) {
      const uint64_t lost_mask = (uint64_t{1} << lost) - 1;  // The first `lost` data splits.
      auto res = c->Reconstruct(splits.data(), crcs.data(), c->all_mask() & ~lost_mask, out.data());
      all_ok = all_ok && res.ok() && out == page;
    }
    const long after = g_allocations;
    EXPECT_TRUE(all_ok) << "RS(" << k << "," << r << ")";
    EXPECT_EQ(after - before, 0) << "RS(" << k << "," << r << ") allocated on the fast path";
  }
}

}  // namespace
}  // namespace tessera::coding
