// SwapFileServer over the in-memory store double: the FUSE file maps byte B to byte B % 4096 of
// page B / 4096; whole-page and partial-page reads and writes (with O_DIRECT, as the loop
// device issues them), the size bounds, and a lost page answered with EIO and recorded.
// Needs root and /dev/fuse (skipped otherwise).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "client/testing/memory_page_store.h"
#include "kernel_shim/swap/swap_file_server.h"
#include "tests/support/test_util.h"

namespace tessera {
namespace {

constexpr size_t kPage = 4096;

class SwapFileServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "mounting FUSE needs root";
    if (::access("/dev/fuse", R_OK | W_OK) != 0) GTEST_SKIP() << "no /dev/fuse in this kernel";
    store_ = std::make_unique<client::testing::MemoryPageStore>(1024);
    mnt_ = tmp_.path() + "/mnt";
    ASSERT_EQ(::mkdir(mnt_.c_str(), 0700), 0);
    kernel_shim::SwapFileOptions o;
    o.mountpoint = mnt_;
    o.size_bytes = 256 * kPage;
    o.threads = 2;
    auto s = kernel_shim::SwapFileServer::Create(store_.get(), o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    ASSERT_TRUE(server_->Mount().ok());
    loop_ = std::thread([this] { run_status_ = server_->Run(); });
  }
  void TearDown() override {
    if (fd_ >= 0) ::close(fd_);
    if (server_) {
      server_->Exit();
      if (loop_.joinable()) loop_.join();
      EXPECT_TRUE(run_status_.ok()) << run_status_;
    }
  }
  void Open() {
    fd_ = ::open(server_->file_path().c_str(), O_RDWR | O_DIRECT);
    ASSERT_GE(fd_, 0) << std::strerror(errno);
  }
  static uint8_t* Aligned(size_t bytes) {
    return static_cast<uint8_t*>(std::aligned_alloc(kPage, bytes));
  }

  testing::TempDir tmp_;
  std::string mnt_;
  std::unique_ptr<client::testing::MemoryPageStore> store_;
  std::unique_ptr<kernel_shim::SwapFileServer> server_;
  std::thread loop_;
  Status run_status_;
  int fd_ = -1;
};

TEST_F(SwapFileServerTest, WholePagesGoToTheirStorePages) {
  Open();
  struct stat st;
  ASSERT_EQ(::fstat(fd_, &st), 0);
  EXPECT_EQ(st.st_size, 256 * kPage);
  std::unique_ptr<uint8_t, decltype(&std::free)> buf(Aligned(4 * kPage), &std::free);
  for (size_t i = 0; i < 4 * kPage; ++i) buf.get()[i] = static_cast<uint8_t>(i * 7 + 3);
  ASSERT_EQ(::pwrite(fd_, buf.get(), 4 * kPage, 10 * kPage), static_cast<ssize_t>(4 * kPage));
  std::vector<uint8_t> page(kPage);
  for (int p = 0; p < 4; ++p) {
    ASSERT_TRUE(store_->ReadPage(10 + p, page.data()).ok());
    EXPECT_EQ(std::memcmp(page.data(), buf.get() + p * kPage, kPage), 0) << "page " << 10 + p;
  }
  std::unique_ptr<uint8_t, decltype(&std::free)> back(Aligned(4 * kPage), &std::free);
  ASSERT_EQ(::pread(fd_, back.get(), 4 * kPage, 10 * kPage), static_cast<ssize_t>(4 * kPage));
  EXPECT_EQ(std::memcmp(back.get(), buf.get(), 4 * kPage), 0);
  // A page never written reads as zeros.
  ASSERT_EQ(::pread(fd_, back.get(), kPage, 200 * kPage), static_cast<ssize_t>(kPage));
  for (size_t i = 0; i < kPage; ++i) ASSERT_EQ(back.get()[i], 0);
  EXPECT_EQ(server_->Stats().pages_written, 4u);
}

TEST_F(SwapFileServerTest, PartialPagesAreReadPatchedAndWritten) {
  // Buffered (no O_DIRECT): odd offsets and sizes reach the daemon as they are (direct_io file).
  const int fd = ::open(server_->file_path().c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> page(kPage, 0xAB);
  ASSERT_TRUE(store_->WritePage(3, page.data()).ok());
  ASSERT_TRUE(store_->WritePage(4, page.data()).ok());
  const char msg[] = "tessera swap header";
  // Straddles pages 3 and 4.
  ASSERT_EQ(::pwrite(fd, msg, sizeof msg, 4 * kPage - 5), static_cast<ssize_t>(sizeof msg));
  std::vector<uint8_t> p3(kPage), p4(kPage);
  ASSERT_TRUE(store_->ReadPage(3, p3.data()).ok());
  ASSERT_TRUE(store_->ReadPage(4, p4.data()).ok());
  EXPECT_EQ(std::memcmp(p3.data() + kPage - 5, msg, 5), 0);
  EXPECT_EQ(std::memcmp(p4.data(), msg + 5, sizeof msg - 5), 0);
  EXPECT_EQ(p3[0], 0xAB);  // The rest of each page is kept.
  EXPECT_EQ(p4[sizeof msg - 5], 0xAB);
  char back[sizeof msg];
  ASSERT_EQ(::pread(fd, back, sizeof msg, 4 * kPage - 5), static_cast<ssize_t>(sizeof msg));
  EXPECT_EQ(std::memcmp(back, msg, sizeof msg), 0);
  EXPECT_GE(server_->Stats().partial_page_ops, 2u);
  ::close(fd);
}

TEST_F(SwapFileServerTest, TheSizeIsABound) {
  Open();
  std::unique_ptr<uint8_t, decltype(&std::free)> buf(Aligned(2 * kPage), &std::free);
  std::memset(buf.get(), 1, 2 * kPage);
  // The last page is writable; past it there is no room.
  EXPECT_EQ(::pwrite(fd_, buf.get(), kPage, 255 * kPage), static_cast<ssize_t>(kPage));
  errno = 0;
  EXPECT_LT(::pwrite(fd_, buf.get(), kPage, 256 * kPage), 0);
  // Reads stop at the end of the file.
  EXPECT_EQ(::pread(fd_, buf.get(), 2 * kPage, 255 * kPage), static_cast<ssize_t>(kPage));
  EXPECT_EQ(::pread(fd_, buf.get(), kPage, 256 * kPage), 0);
  EXPECT_NE(::ftruncate(fd_, kPage), 0) << "the size of a swap file must not change";
  // Page 256 of the store was never written by the file.
  std::vector<uint8_t> page(kPage, 0xFF);
  ASSERT_TRUE(store_->ReadPage(256, page.data()).ok());
  EXPECT_EQ(page[0], 0);
}

TEST_F(SwapFileServerTest, ALostPageIsAnIoErrorAndIsNamed) {
  Open();
  std::unique_ptr<uint8_t, decltype(&std::free)> buf(Aligned(3 * kPage), &std::free);
  std::memset(buf.get(), 5, 3 * kPage);
  ASSERT_EQ(::pwrite(fd_, buf.get(), 3 * kPage, 20 * kPage), static_cast<ssize_t>(3 * kPage));
  store_->FailReads(21);
  errno = 0;
  EXPECT_LT(::pread(fd_, buf.get(), 3 * kPage, 20 * kPage), 0);
  EXPECT_EQ(errno, EIO);
  // Its neighbours still read.
  EXPECT_EQ(::pread(fd_, buf.get(), kPage, 22 * kPage), static_cast<ssize_t>(kPage));
  EXPECT_EQ(server_->Stats().lost_pages, 1u);
  EXPECT_EQ(server_->Stats().read_errors, 1u);
  ASSERT_EQ(server_->LostPages().size(), 1u);
  EXPECT_EQ(server_->LostPages()[0], 21u);
}

TEST(SwapFileServerOptions, BadOptionsAreRejectedBeforeAnythingIsMounted) {
  client::testing::MemoryPageStore store(64);
  kernel_shim::SwapFileOptions o;
  o.mountpoint = "/nonexistent";
  o.size_bytes = 65 * kPage;
  EXPECT_EQ(kernel_shim::SwapFileServer::Create(&store, o).status().code(),
            StatusCode::kInvalidArgument);  // Larger than the store.
  o.size_bytes = 100;
  EXPECT_EQ(kernel_shim::SwapFileServer::Create(&store, o).status().code(),
            StatusCode::kInvalidArgument);  // Not whole pages.
  o.size_bytes = 8 * kPage;
  o.threads = 0;
  EXPECT_EQ(kernel_shim::SwapFileServer::Create(&store, o).status().code(),
            StatusCode::kInvalidArgument);
  o.threads = 2;
  o.file_name = "a/b";
  EXPECT_EQ(kernel_shim::SwapFileServer::Create(&store, o).status().code(),
            StatusCode::kInvalidArgument);
  o.file_name = "swap";
  auto s = kernel_shim::SwapFileServer::Create(&store, o);
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE((*s)->Mount().ok()) << "mounting on a missing directory must fail";
}

}  // namespace
}  // namespace tessera
