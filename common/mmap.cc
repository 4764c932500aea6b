#include "common/mmap.h"

#include <sys/mman.h>

#include "common/logging.h"

namespace tessera {
namespace {
constexpr size_t kSmallPage = 4096;
constexpr size_t kHugePage = 2u << 20;
size_t RoundUp(size_t v, size_t a) { return (v + a - 1) / a * a; }
}  // namespace

Result<MappedRegion> MappedRegion::Anonymous(size_t size, Options options) {
  if (size == 0) return InvalidArgument("cannot map 0 bytes");
  int flags = MAP_ANONYMOUS | (options.shared ? MAP_SHARED : MAP_PRIVATE);
  if (options.populate) flags |= MAP_POPULATE;
  MappedRegion region;
  if (options.huge_pages) {
    size_t len = RoundUp(size, kHugePage);
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, flags | MAP_HUGETLB, -1, 0);
    if (p != MAP_FAILED) {
      region.data_ = static_cast<uint8_t*>(p);
      region.size_ = len;
      region.huge_ = true;
      return region;
    }
    TLOG(WARNING) << "huge pages unavailable for " << len
                  << " bytes, using normal pages (reserve some in /proc/sys/vm/nr_hugepages)";
  }
  size_t len = RoundUp(size, kSmallPage);
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) return ErrnoError("mmap of ", len, " bytes");
  region.data_ = static_cast<uint8_t*>(p);
  region.size_ = len;
  return region;
}

void MappedRegion::Reset() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
  huge_ = false;
}

}  // namespace tessera
