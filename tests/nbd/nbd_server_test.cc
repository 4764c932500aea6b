// Unit tests of the NBD codec and of NbdServer over the in-memory store double, driven by a raw
// socket client written here (byte-level, so it can also send what real clients never would).
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "client/testing/memory_page_store.h"
#include "kernel_shim/nbd/nbd_server.h"
#include "kernel_shim/nbd/protocol.h"

namespace tessera::nbd {
namespace {

using client::kPageSize;
using client::testing::MemoryPageStore;
using client::testing::MemoryPageStoreOptions;

// The store double completes each batch of ops out of order (seeded shuffle), as a remote
// store with several servers does.
std::unique_ptr<MemoryPageStore> OutOfOrderStore(uint64_t pages) {
  return std::make_unique<MemoryPageStore>(
      MemoryPageStoreOptions{.capacity_pages = pages, .shuffle_seed = 1});
}

// ---------------------------------------------------------------- codec

TEST(NbdProtocolTest, GreetingBytes) {
  std::string g = EncodeGreeting(kFlagFixedNewstyle | kFlagNoZeroes);
  ASSERT_EQ(g.size(), 18u);
  EXPECT_EQ(g.substr(0, 8), "NBDMAGIC");
  EXPECT_EQ(g.substr(8, 8), "IHAVEOPT");
  EXPECT_EQ(static_cast<uint8_t>(g[16]), 0);
  EXPECT_EQ(static_cast<uint8_t>(g[17]), 3);
}

TEST(NbdProtocolTest, RequestHeaderRoundTripAndBadMagic) {
  RequestHeader h{kCmdFlagFua, kCmdWrite, 0x0102030405060708ull, 0x1122334455667788ull, 4096};
  std::string b = EncodeRequestHeader(h);
  ASSERT_EQ(b.size(), kRequestHeaderSize);
  EXPECT_EQ(static_cast<uint8_t>(b[0]), 0x25);  // Big-endian magic.
  auto d = DecodeRequestHeader(reinterpret_cast<const uint8_t*>(b.data()));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->flags, h.flags);
  EXPECT_EQ(d->type, h.type);
  EXPECT_EQ(d->cookie, h.cookie);
  EXPECT_EQ(d->offset, h.offset);
  EXPECT_EQ(d->length, h.length);
  b[3] ^= 1;
  auto bad = DecodeRequestHeader(reinterpret_cast<const uint8_t*>(b.data()));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kProtocolError);
}

TEST(NbdProtocolTest, InfoRequestDecoding) {
  std::string p;
  PutU32(&p, 3);
  p += "abc";
  PutU16(&p, 2);
  PutU16(&p, kInfoBlockSize);
  PutU16(&p, kInfoName);
  auto r = DecodeInfoRequest(p);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->name, "abc");
  EXPECT_EQ(r->info_types, (std::vector<uint16_t>{kInfoBlockSize, kInfoName}));
  // Name length beyond the payload, count not matching, too short.
  std::string longer = p;
  longer[3] = 100;
  EXPECT_FALSE(DecodeInfoRequest(longer).ok());
  EXPECT_FALSE(DecodeInfoRequest(p.substr(0, p.size() - 1)).ok());
  EXPECT_FALSE(DecodeInfoRequest("abc").ok());
}

TEST(NbdProtocolTest, RepliesAndInfoEncodings) {
  std::string s = EncodeSimpleReply(kEInval, 7);
  ASSERT_EQ(s.size(), kSimpleReplySize);
  EXPECT_EQ(GetU32(reinterpret_cast<const uint8_t*>(s.data())), kSimpleReplyMagic);
  EXPECT_EQ(GetU32(reinterpret_cast<const uint8_t*>(s.data()) + 4), kEInval);
  std::string e = EncodeStructuredError(9, kEIo, "boom");
  ASSERT_EQ(e.size(), kStructuredHeaderSize + 6 + 4);
  const auto* eb = reinterpret_cast<const uint8_t*>(e.data());
  EXPECT_EQ(GetU32(eb), kStructuredReplyMagic);
  EXPECT_EQ(GetU16(eb + 4), kReplyFlagDone);
  EXPECT_EQ(GetU16(eb + 6), kReplyTypeError);
  EXPECT_EQ(GetU64(eb + 8), 9u);
  EXPECT_EQ(GetU32(eb + 16), 10u);
  EXPECT_EQ(GetU32(eb + 20), kEIo);
  EXPECT_EQ(GetU16(eb + 24), 4u);
  std::string bs = EncodeInfoBlockSize(1, 4096, 1 << 25);
  ASSERT_EQ(bs.size(), 14u);
  EXPECT_EQ(GetU16(reinterpret_cast<const uint8_t*>(bs.data())), kInfoBlockSize);
  EXPECT_EQ(GetU32(reinterpret_cast<const uint8_t*>(bs.data()) + 6), 4096u);
  std::string ie = EncodeInfoExport(1ull << 33, kTransHasFlags);
  ASSERT_EQ(ie.size(), 12u);
  EXPECT_EQ(GetU64(reinterpret_cast<const uint8_t*>(ie.data()) + 2), 1ull << 33);
  std::string o = EncodeOptionReply(kOptGo, kRepErrUnknown, "x");
  ASSERT_EQ(o.size(), 21u);
  EXPECT_EQ(GetU64(reinterpret_cast<const uint8_t*>(o.data())), kOptReplyMagic);
}

// ---------------------------------------------------------------- raw client

// A blocking client on one end of a socketpair; every read has a 10 s bound.
class RawClient {
 public:
  explicit RawClient(int fd) : fd_(fd) {
    struct timeval tv = {10, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~RawClient() { Close(); }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd() const { return fd_; }

  bool Send(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  bool Recv(void* buf, size_t n) {
    auto* p = static_cast<uint8_t*>(buf);
    while (n > 0) {
      ssize_t got = ::recv(fd_, p, n, 0);
      if (got <= 0) return false;
      p += got;
      n -= static_cast<size_t>(got);
    }
    return true;
  }
  std::string RecvString(size_t n) {
    std::string s(n, '\0');
    if (!Recv(s.data(), n)) return "";
    return s;
  }
  // True when the server closed the connection (EOF within the bound).
  bool ClosedByPeer() {
    char c;
    ssize_t n = ::recv(fd_, &c, 1, 0);
    return n == 0 || (n < 0 && errno == ECONNRESET);
  }

  // Reads the greeting and answers with FIXED_NEWSTYLE | NO_ZEROES.
  void Greet() {
    std::string g = RecvString(18);
    ASSERT_EQ(g.substr(0, 8), "NBDMAGIC");
    std::string f;
    PutU32(&f, kClientFlagFixedNewstyle | kClientFlagNoZeroes);
    ASSERT_TRUE(Send(f));
  }
  void SendOption(uint32_t option, const std::string& data) {
    std::string s;
    PutU64(&s, kIHaveOpt);
    PutU32(&s, option);
    PutU32(&s, static_cast<uint32_t>(data.size()));
    s += data;
    ASSERT_TRUE(Send(s));
  }
  struct OptReply {
    uint32_t option = 0, type = 0;
    std::string data;
    bool ok = false;
  };
  OptReply ReadOptionReply() {
    OptReply r;
    uint8_t h[20];
    if (!Recv(h, sizeof h)) return r;
    EXPECT_EQ(GetU64(h), kOptReplyMagic);
    r.option = GetU32(h + 8);
    r.type = GetU32(h + 12);
    r.data = RecvString(GetU32(h + 16));
    r.ok = true;
    return r;
  }
  static std::string InfoPayload(const std::string& name, std::vector<uint16_t> infos = {}) {
    std::string p;
    PutU32(&p, static_cast<uint32_t>(name.size()));
    p += name;
    PutU16(&p, static_cast<uint16_t>(infos.size()));
    for (uint16_t i : infos) PutU16(&p, i);
    return p;
  }
  // Full handshake to transmission; returns the export size and flags.
  void Go(const std::string& name, bool structured, uint64_t* size = nullptr,
          uint16_t* flags = nullptr) {
    Greet();
    if (structured) {
      SendOption(kOptStructuredReply, "");
      OptReply r = ReadOptionReply();
      ASSERT_EQ(r.type, kRepAck);
    }
    structured_ = structured;
    SendOption(kOptGo, InfoPayload(name, {kInfoBlockSize}));
    for (;;) {
      OptReply r = ReadOptionReply();
      ASSERT_TRUE(r.ok);
      if (r.type == kRepAck) break;
      ASSERT_EQ(r.type, kRepInfo);
      const auto* d = reinterpret_cast<const uint8_t*>(r.data.data());
      if (GetU16(d) == kInfoExport) {
        if (size) *size = GetU64(d + 2);
        if (flags) *flags = GetU16(d + 10);
      }
    }
  }

  bool Request(uint16_t type, uint64_t offset, uint32_t length, uint64_t cookie,
               const std::string& payload = "", uint16_t flags = 0) {
    return Send(EncodeRequestHeader({flags, type, cookie, offset, length}) + payload);
  }
  struct Reply {
    bool ok = false;
    uint64_t cookie = 0;
    uint32_t error = 0;
    std::string data;  // Read data (structured: the OFFSET_DATA payload after the offset).
    uint64_t data_offset = 0;
    uint16_t chunk_type = 0;
  };
  // Reads one reply; `read_len` is the data length a successful simple read carries, looked
  // up by cookie.
  Reply ReadReply(const std::map<uint64_t, uint32_t>& read_len = {}) {
    Reply r;
    uint8_t m[4];
    if (!Recv(m, 4)) return r;
    if (GetU32(m) == kSimpleReplyMagic) {
      uint8_t h[12];
      if (!Recv(h, 12)) return r;
      r.error = GetU32(h);
      r.cookie = GetU64(h + 4);
      auto it = read_len.find(r.cookie);
      if (r.error == 0 && it != read_len.end()) r.data = RecvString(it->second);
      r.ok = true;
      return r;
    }
    EXPECT_EQ(GetU32(m), kStructuredReplyMagic);
    uint8_t h[16];
    if (!Recv(h, 16)) return r;
    const uint16_t flags = GetU16(h);
    r.chunk_type = GetU16(h + 2);
    r.cookie = GetU64(h + 4);
    const uint32_t len = GetU32(h + 12);
    EXPECT_TRUE(flags & kReplyFlagDone);  // The server sends one chunk per request.
    std::string body = RecvString(len);
    if (r.chunk_type == kReplyTypeOffsetData) {
      r.data_offset = GetU64(reinterpret_cast<const uint8_t*>(body.data()));
      r.data = body.substr(8);
    } else if (r.chunk_type == kReplyTypeError) {
      r.error = GetU32(reinterpret_cast<const uint8_t*>(body.data()));
    }
    r.ok = true;
    return r;
  }
  Reply Do(uint16_t type, uint64_t offset, uint32_t length, const std::string& payload = "",
           uint16_t flags = 0) {
    const uint64_t cookie = next_cookie_++;
    EXPECT_TRUE(Request(type, offset, length, cookie, payload, flags));
    Reply r = ReadReply({{cookie, type == kCmdRead ? length : 0}});
    EXPECT_EQ(r.cookie, cookie);
    return r;
  }

 private:
  int fd_;
  bool structured_ = false;
  uint64_t next_cookie_ = 1;
};

std::string Pattern(size_t n, uint8_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 7 + (i >> 12));
  return s;
}

// A server over a MemoryPageStore; Connect() gives a client on a socketpair.
class NbdServerTest : public ::testing::Test {
 protected:
  void SetUpServer(std::vector<ExportSpec> exports, uint64_t store_pages = 64,
                   uint32_t max_payload = 1 << 20) {
    store_ = OutOfOrderStore(store_pages);
    NbdServerOptions o;
    o.exports = std::move(exports);
    o.max_payload = max_payload;
    auto s = NbdServer::Create(store_.get(), o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
  }
  void SetUp() override { SetUpServer({{"disk", "test disk", 16 * kPageSize + 100, 0}}); }
  std::unique_ptr<RawClient> Connect() {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    server_->ServeConnection(UniqueFd(sv[0]));
    return std::make_unique<RawClient>(sv[1]);
  }
  void TearDown() override {
    if (server_) {
      EXPECT_TRUE(server_->Shutdown().ok());
      EXPECT_EQ(server_->active_connections(), 0u);
    }
    if (store_) {
      EXPECT_EQ(store_->out_of_range_ops(), 0u) << "the server sent ops beyond the store";
    }
  }

  std::unique_ptr<MemoryPageStore> store_;
  std::unique_ptr<NbdServer> server_;
};

TEST_F(NbdServerTest, CreateRejectsBadExportLists) {
  MemoryPageStore s(10);
  NbdServerOptions o;
  EXPECT_FALSE(NbdServer::Create(&s, o).ok());
  o.exports = {{"a", "", 11 * kPageSize, 0}};
  EXPECT_FALSE(NbdServer::Create(&s, o).ok());  // Beyond the store.
  o.exports = {{"a", "", 4 * kPageSize, 0}, {"a", "", kPageSize, 5}};
  EXPECT_FALSE(NbdServer::Create(&s, o).ok());  // Duplicate name.
  o.exports = {{"a", "", 4 * kPageSize, 0}, {"b", "", kPageSize, 3}};
  EXPECT_FALSE(NbdServer::Create(&s, o).ok());  // Overlap.
  o.exports = {{"a", "", 4 * kPageSize, 0}, {"b", "", kPageSize, 4}};
  EXPECT_TRUE(NbdServer::Create(&s, o).ok());
}

TEST_F(NbdServerTest, ListInfoUnknownOptionAndGo) {
  auto c = Connect();
  c->Greet();
  c->SendOption(kOptList, "");
  auto r = c->ReadOptionReply();
  ASSERT_EQ(r.type, kRepServer);
  EXPECT_EQ(GetU32(reinterpret_cast<const uint8_t*>(r.data.data())), 4u);
  EXPECT_EQ(r.data.substr(4, 4), "disk");
  EXPECT_EQ(c->ReadOptionReply().type, kRepAck);

  c->SendOption(kOptInfo, RawClient::InfoPayload("nope"));
  r = c->ReadOptionReply();
  EXPECT_EQ(r.type, kRepErrUnknown);

  c->SendOption(4242, "junk");
  r = c->ReadOptionReply();
  EXPECT_EQ(r.type, kRepErrUnsup);
  EXPECT_EQ(r.option, 4242u);

  c->SendOption(kOptStartTls, "");
  EXPECT_EQ(c->ReadOptionReply().type, kRepErrUnsup);

  c->SendOption(kOptInfo, "\x00\x00\x00\x09zz");  // Name length beyond the data.
  EXPECT_EQ(c->ReadOptionReply().type, kRepErrInvalid);

  c->SendOption(kOptInfo, RawClient::InfoPayload("disk", {kInfoBlockSize}));
  bool saw_block = false, saw_export = false;
  for (;;) {
    r = c->ReadOptionReply();
    ASSERT_TRUE(r.ok);
    if (r.type == kRepAck) break;
    ASSERT_EQ(r.type, kRepInfo);
    const auto* d = reinterpret_cast<const uint8_t*>(r.data.data());
    if (GetU16(d) == kInfoBlockSize) {
      saw_block = true;
      EXPECT_EQ(GetU32(d + 2), 1u);
      EXPECT_EQ(GetU32(d + 6), 4096u);
      EXPECT_EQ(GetU32(d + 10), 1u << 20);
    }
    if (GetU16(d) == kInfoExport) {
      saw_export = true;
      EXPECT_EQ(GetU64(d + 2), 16 * kPageSize + 100);
      const uint16_t f = GetU16(d + 10);
      EXPECT_EQ(f, kTransHasFlags | kTransSendFlush | kTransSendFua | kTransSendTrim |
                       kTransSendWriteZeroes | kTransCanMultiConn);
    }
  }
  EXPECT_TRUE(saw_block && saw_export);
  // Still in option haggling after INFO: GO works and data moves.
  c->SendOption(kOptGo, RawClient::InfoPayload(""));  // "" = the default export.
  while (c->ReadOptionReply().type != kRepAck) {
  }
  auto w = c->Do(kCmdWrite, 0, 10, "0123456789");
  EXPECT_EQ(w.error, 0u);
  auto rd = c->Do(kCmdRead, 0, 10);
  EXPECT_EQ(rd.data, "0123456789");
}

TEST_F(NbdServerTest, AbortAndBadOptionMagicAndOldStyleExportName) {
  auto a = Connect();
  a->Greet();
  a->SendOption(kOptAbort, "");
  EXPECT_EQ(a->ReadOptionReply().type, kRepAck);
  EXPECT_TRUE(a->ClosedByPeer());

  auto b = Connect();
  b->Greet();
  ASSERT_TRUE(b->Send(std::string(16, 'x')));
  EXPECT_TRUE(b->ClosedByPeer());

  auto c = Connect();
  c->Greet();
  c->SendOption(kOptExportName, "disk");
  std::string r = c->RecvString(10);  // NO_ZEROES: size and flags only.
  ASSERT_EQ(r.size(), 10u);
  EXPECT_EQ(GetU64(reinterpret_cast<const uint8_t*>(r.data())), 16 * kPageSize + 100);
  auto rd = c->Do(kCmdRead, 0, 4);
  EXPECT_EQ(rd.error, 0u);
  EXPECT_EQ(rd.data, std::string(4, '\0'));

  auto d = Connect();
  d->Greet();
  d->SendOption(kOptExportName, "missing");
  EXPECT_TRUE(d->ClosedByPeer());
}

TEST_F(NbdServerTest, AlignedAndUnalignedReadWrite) {
  auto c = Connect();
  uint64_t size = 0;
  c->Go("disk", false, &size);
  ASSERT_EQ(size, 16 * kPageSize + 100);
  const std::string a = Pattern(3 * kPageSize, 1);
  EXPECT_EQ(c->Do(kCmdWrite, kPageSize, static_cast<uint32_t>(a.size()), a).error, 0u);
  EXPECT_EQ(c->Do(kCmdRead, kPageSize, static_cast<uint32_t>(a.size())).data, a);
  // Unaligned write spanning three pages: bytes around it must survive.
  const std::string b = Pattern(5000, 99);
  EXPECT_EQ(c->Do(kCmdWrite, kPageSize + 3000, 5000, b).error, 0u);
  std::string want = a;
  want.replace(3000, 5000, b);
  EXPECT_EQ(c->Do(kCmdRead, kPageSize, static_cast<uint32_t>(want.size())).data, want);
  // Unaligned read inside one page and across pages.
  EXPECT_EQ(c->Do(kCmdRead, kPageSize + 2999, 3).data, want.substr(2999, 3));
  EXPECT_EQ(c->Do(kCmdRead, kPageSize + 4090, 20).data, want.substr(4090, 20));
  // The partial last page: the export ends 100 bytes into page 16.
  const std::string tail = Pattern(100, 5);
  EXPECT_EQ(c->Do(kCmdWrite, 16 * kPageSize, 100, tail).error, 0u);
  EXPECT_EQ(c->Do(kCmdRead, 16 * kPageSize, 100).data, tail);
  EXPECT_GE(server_->Stats().rmw_pages, 3u);
  std::vector<uint8_t> p1 = store_->Page(1);
  EXPECT_EQ(std::string(p1.begin(), p1.end()), want.substr(0, kPageSize));
}

TEST_F(NbdServerTest, OutOfRangeUnknownAndOversizedRequestsKeepDataSafe) {
  auto c = Connect();
  c->Go("disk", false);
  const uint64_t size = 16 * kPageSize + 100;
  const std::string a = Pattern(kPageSize, 3);
  EXPECT_EQ(c->Do(kCmdWrite, 15 * kPageSize, kPageSize, a).error, 0u);
  const uint64_t writes_before = store_->writes_stored();
  EXPECT_EQ(c->Do(kCmdRead, size - 10, 11).error, kEInval);
  EXPECT_EQ(c->Do(kCmdWrite, size - 10, 11, std::string(11, 'x')).error, kENoSpc);
  EXPECT_EQ(c->Do(kCmdWrite, ~0ull - 5, 11, std::string(11, 'x')).error, kENoSpc);  // Wraps.
  EXPECT_EQ(c->Do(kCmdWriteZeroes, size, 1).error, kENoSpc);
  EXPECT_EQ(c->Do(kCmdTrim, size + kPageSize, kPageSize).error, kEInval);
  EXPECT_EQ(c->Do(77, 0, 0).error, kEInval);                   // Unknown command.
  EXPECT_EQ(c->Do(kCmdBlockStatus, 0, 4096).error, kEInval);   // Not advertised.
  EXPECT_EQ(c->Do(kCmdRead, 0, 4096, "", kCmdFlagFua).error, kEInval);  // Bad flag for READ.
  EXPECT_EQ(c->Do(kCmdRead, 0, kPageSize, "", kCmdFlagDf).error, kEInval);  // DF w/o structured.
  EXPECT_EQ(c->Do(kCmdRead, 0, (1 << 20) + 1).error, kEInval);  // Longer than the maximum.
  EXPECT_EQ(store_->writes_stored(), writes_before) << "a refused request reached the store";
  // The connection still works and the data is intact.
  EXPECT_EQ(c->Do(kCmdRead, 15 * kPageSize, kPageSize).data, a);
  // A WRITE longer than the maximum closes the connection (its payload is not read).
  ASSERT_TRUE(c->Request(kCmdWrite, 0, (1 << 20) + 1, 99));
  EXPECT_TRUE(c->ClosedByPeer());
  EXPECT_EQ(store_->Page(15), std::vector<uint8_t>(a.begin(), a.end()));
}

TEST_F(NbdServerTest, BadRequestMagicClosesAfterAnsweringEarlierRequests) {
  auto c = Connect();
  c->Go("disk", false);
  ASSERT_TRUE(c->Request(kCmdWrite, 0, 4, 1, "abcd"));
  std::string bad = EncodeRequestHeader({0, kCmdRead, 2, 0, 4});
  bad[0] = 0x12;
  ASSERT_TRUE(c->Send(bad));
  auto r = c->ReadReply();
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.cookie, 1u);
  EXPECT_EQ(r.error, 0u);
  EXPECT_TRUE(c->ClosedByPeer());
  EXPECT_EQ(store_->Page(0)[3], 'd');
}

TEST_F(NbdServerTest, ClientVanishingMidHeaderOrMidPayload) {
  const std::string a = Pattern(kPageSize, 8);
  {
    auto c = Connect();
    c->Go("disk", false);
    EXPECT_EQ(c->Do(kCmdWrite, 0, kPageSize, a).error, 0u);
    // Half a header, then gone.
    ASSERT_TRUE(c->Send(EncodeRequestHeader({0, kCmdWrite, 5, 0, kPageSize}).substr(0, 13)));
  }
  {
    auto c = Connect();
    c->Go("disk", false);
    // A full header and half its payload, then gone: none of it may reach the store.
    ASSERT_TRUE(c->Send(EncodeRequestHeader({0, kCmdWrite, 6, 0, kPageSize}) +
                        std::string(kPageSize / 2, 'Z')));
  }
  {
    auto c = Connect();  // Vanishes during the handshake.
    c->Greet();
    c->SendOption(kOptGo, RawClient::InfoPayload("disk").substr(0, 3));
  }
  ASSERT_TRUE(server_->Shutdown().ok());  // Returns once every connection is gone.
  EXPECT_EQ(server_->active_connections(), 0u);
  EXPECT_EQ(store_->Page(0), std::vector<uint8_t>(a.begin(), a.end()));
}

TEST_F(NbdServerTest, RepliesInCompletionOrder) {
  auto c = Connect();
  c->Go("disk", false);
  EXPECT_EQ(c->Do(kCmdWrite, 0, 2 * kPageSize, Pattern(2 * kPageSize, 4)).error, 0u);
  store_->Hold();
  ASSERT_TRUE(c->Request(kCmdRead, 0, kPageSize, 100));
  ASSERT_TRUE(c->Request(kCmdRead, kPageSize, kPageSize, 200));
  ASSERT_TRUE(store_->WaitHeld(2)) << "the two reads never reached the store together";
  store_->Release(MemoryPageStore::ReleaseOrder::kReverse);
  std::map<uint64_t, uint32_t> lens = {{100, kPageSize}, {200, kPageSize}};
  auto first = c->ReadReply(lens);
  auto second = c->ReadReply(lens);
  EXPECT_EQ(first.cookie, 200u) << "the later request completed first and must be answered first";
  EXPECT_EQ(second.cookie, 100u);
  const std::string p = Pattern(2 * kPageSize, 4);
  EXPECT_EQ(first.data, p.substr(kPageSize));
  EXPECT_EQ(second.data, p.substr(0, kPageSize));
}

TEST_F(NbdServerTest, ManyRequestsInFlight) {
  auto c = Connect();
  c->Go("disk", false);
  constexpr int kN = 400;
  // Writes of 64 bytes each at distinct offsets, all sent before reading any reply: most share
  // pages, so this also runs many concurrent read-modify-writes of the same pages.
  std::string expect(16 * kPageSize, '\0');
  std::thread sender([&] {
    for (int i = 0; i < kN; ++i) {
      const uint64_t off = static_cast<uint64_t>(i) * 160;
      std::string d = Pattern(64, static_cast<uint8_t>(i));
      ASSERT_TRUE(c->Request(kCmdWrite, off, 64, 1000 + i, d));
    }
  });
  for (int i = 0; i < kN; ++i) {
    std::string d = Pattern(64, static_cast<uint8_t>(i));
    expect.replace(static_cast<size_t>(i) * 160, 64, d);
  }
  std::set<uint64_t> seen;
  for (int i = 0; i < kN; ++i) {
    auto r = c->ReadReply();
    ASSERT_TRUE(r.ok) << "reply " << i << " missing";
    EXPECT_EQ(r.error, 0u);
    seen.insert(r.cookie);
  }
  sender.join();
  EXPECT_EQ(seen.size(), static_cast<size_t>(kN));
  auto rd = c->Do(kCmdRead, 0, 16 * kPageSize);
  EXPECT_TRUE(rd.data == expect) << "an unaligned write lost another's bytes";
}

// A client that does not read its replies for a while: replies that do not fit the socket go
// to the outbox (store threads never block on the socket) and still arrive whole and in a
// consistent framing; then a client that leaves with replies pending.
TEST_F(NbdServerTest, SlowReaderGetsEveryReplyWholeAndLeavingEarlyIsSafe) {
  auto c = Connect();
  c->Go("disk", true);
  const std::string a = Pattern(16 * kPageSize, 11);
  EXPECT_EQ(c->Do(kCmdWrite, 0, 16 * kPageSize, a).error, 0u);
  constexpr int kN = 96;  // 96 x 64 KiB of replies: far beyond a socket buffer.
  for (int i = 0; i < kN; ++i) {
    const uint64_t off = static_cast<uint64_t>(i % 4) * 4 * kPageSize + (i % 3);
    ASSERT_TRUE(c->Request(kCmdRead, off, 4 * kPageSize - 3, 500 + i));
  }
  std::set<uint64_t> seen;
  for (int i = 0; i < kN; ++i) {
    auto r = c->ReadReply();
    ASSERT_TRUE(r.ok) << "reply " << i;
    ASSERT_EQ(r.chunk_type, kReplyTypeOffsetData);
    const int j = static_cast<int>(r.cookie) - 500;
    const uint64_t off = static_cast<uint64_t>(j % 4) * 4 * kPageSize + (j % 3);
    EXPECT_EQ(r.data_offset, off);
    EXPECT_TRUE(r.data == a.substr(off, 4 * kPageSize - 3)) << "cookie " << r.cookie;
    seen.insert(r.cookie);
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kN));
  for (int i = 0; i < kN; ++i) ASSERT_TRUE(c->Request(kCmdRead, 0, 4 * kPageSize, 900 + i));
  c->Close();  // Gone with most replies unsent.
  ASSERT_TRUE(server_->Shutdown().ok());
  EXPECT_EQ(server_->active_connections(), 0u);
}

TEST_F(NbdServerTest, ConcurrentUnalignedWritesFromTwoConnectionsLoseNothing) {
  auto a = Connect();
  auto b = Connect();
  a->Go("disk", false);
  b->Go("disk", false);
  // Connection a writes the even 32-byte slots of pages 0..3, b the odd ones, all in flight.
  constexpr int kSlots = 4 * kPageSize / 32;
  auto run = [&](RawClient* c, int parity) {
    int sent = 0;
    for (int s = parity; s < kSlots; s += 2, ++sent) {
      ASSERT_TRUE(c->Request(kCmdWrite, s * 32, 32, s, std::string(32, static_cast<char>('A' + s % 26))));
    }
    for (int i = 0; i < sent; ++i) {
      auto r = c->ReadReply();
      ASSERT_TRUE(r.ok);
      EXPECT_EQ(r.error, 0u);
    }
  };
  std::thread ta(run, a.get(), 0), tb(run, b.get(), 1);
  ta.join();
  tb.join();
  auto rd = a->Do(kCmdRead, 0, 4 * kPageSize);
  ASSERT_EQ(rd.data.size(), 4 * kPageSize);
  for (int s = 0; s < kSlots; ++s) {
    ASSERT_EQ(rd.data.substr(s * 32, 32), std::string(32, static_cast<char>('A' + s % 26)))
        << "slot " << s << " lost";
  }
}

TEST_F(NbdServerTest, StructuredRepliesAndStoreErrors) {
  auto c = Connect();
  uint16_t flags = 0;
  c->Go("disk", true, nullptr, &flags);
  EXPECT_TRUE(flags & kTransSendDf);
  const std::string a = Pattern(6000, 2);
  auto w = c->Do(kCmdWrite, 100, 6000, a);
  EXPECT_EQ(w.chunk_type, kReplyTypeNone);
  EXPECT_EQ(w.error, 0u);
  auto r = c->Do(kCmdRead, 100, 6000, "", kCmdFlagDf);
  EXPECT_EQ(r.chunk_type, kReplyTypeOffsetData);
  EXPECT_EQ(r.data_offset, 100u);
  EXPECT_EQ(r.data, a);
  auto bad = c->Do(kCmdRead, 1ull << 40, 1);
  EXPECT_EQ(bad.chunk_type, kReplyTypeError);
  EXPECT_EQ(bad.error, kEInval);
  store_->FailReads(3);
  auto lost = c->Do(kCmdRead, 3 * kPageSize, 10);
  EXPECT_EQ(lost.chunk_type, kReplyTypeError);
  EXPECT_EQ(lost.error, kEIo);
  // An unaligned write into the failing page cannot read-modify-write it: EIO, nothing written.
  const uint64_t writes = store_->writes_stored();
  EXPECT_EQ(c->Do(kCmdWrite, 3 * kPageSize + 1, 10, "0123456789").error, kEIo);
  EXPECT_EQ(store_->writes_stored(), writes);
  // A whole-page write of it still works.
  EXPECT_EQ(c->Do(kCmdWrite, 3 * kPageSize, kPageSize, Pattern(kPageSize, 1)).error, 0u);
}

TEST_F(NbdServerTest, UnavailableOpsAreRetriedThenReportedAsEio) {
  auto c = Connect();
  c->Go("disk", false);
  const std::string a = Pattern(4 * kPageSize, 21);
  const Status loss = Unavailable("injected server loss");
  store_->FailNextOps(3, loss);  // Fewer failures than retry rounds: the write succeeds.
  EXPECT_EQ(c->Do(kCmdWrite, 0, 4 * kPageSize, a).error, 0u);
  EXPECT_GE(server_->Stats().retried_ops, 3u);
  store_->FailNextOps(2, loss);
  EXPECT_EQ(c->Do(kCmdRead, 0, 4 * kPageSize).data, a);
  store_->FailNextOps(1000, loss);  // The store stays unavailable: EIO, data untouched.
  EXPECT_EQ(c->Do(kCmdWrite, 0, kPageSize, std::string(kPageSize, 'x')).error, kEIo);
  EXPECT_EQ(c->Do(kCmdRead, 0, 10).error, kEIo);
  store_->FailNextOps(0, Status::Ok());
  EXPECT_EQ(c->Do(kCmdRead, 0, 4 * kPageSize).data, a);
}

TEST_F(NbdServerTest, TrimWriteZeroesFlushAndFua) {
  auto c = Connect();
  c->Go("disk", false);
  const std::string a = Pattern(8 * kPageSize, 6);
  EXPECT_EQ(c->Do(kCmdWrite, 0, 8 * kPageSize, a).error, 0u);
  // TRIM of [1.5 pages, 4.5 pages): pages 2 and 3 trimmed, the partial ones left alone.
  const uint64_t trimmed = store_->trimmed_pages();
  EXPECT_EQ(c->Do(kCmdTrim, kPageSize + 2048, 3 * kPageSize).error, 0u);
  EXPECT_EQ(store_->trimmed_pages() - trimmed, 2u);
  EXPECT_EQ(server_->Stats().trimmed_pages, 2u);
  EXPECT_EQ(c->Do(kCmdRead, kPageSize, kPageSize).data, a.substr(kPageSize, kPageSize));
  EXPECT_EQ(c->Do(kCmdRead, 2 * kPageSize, 2 * kPageSize).data, std::string(2 * kPageSize, '\0'));
  // WRITE_ZEROES unaligned: [5 pages + 100, 7 pages + 50) reads as zeros, neighbours intact.
  EXPECT_EQ(c->Do(kCmdWriteZeroes, 5 * kPageSize + 100, 2 * kPageSize - 50).error, 0u);
  std::string want = a.substr(5 * kPageSize, 3 * kPageSize);
  std::memset(want.data() + 100, 0, 2 * kPageSize - 50);
  EXPECT_EQ(c->Do(kCmdRead, 5 * kPageSize, 3 * kPageSize).data, want);
  EXPECT_EQ(store_->trimmed_pages() - trimmed, 3u);  // Page 6 was whole: trimmed.
  // With NO_HOLE the whole pages are written as zeros instead.
  const uint64_t w0 = store_->writes_stored();
  EXPECT_EQ(c->Do(kCmdWriteZeroes, 0, kPageSize, "", kCmdFlagNoHole).error, 0u);
  EXPECT_EQ(store_->writes_stored() - w0, 1u);
  EXPECT_EQ(store_->trimmed_pages() - trimmed, 3u);
  EXPECT_EQ(store_->Page(0), std::vector<uint8_t>(kPageSize, 0));
  // FLUSH and FUA reach the store's Flush().
  const uint64_t f0 = store_->flushes();
  EXPECT_EQ(c->Do(kCmdFlush, 0, 0).error, 0u);
  EXPECT_EQ(c->Do(kCmdWrite, 0, 5, "hello", kCmdFlagFua).error, 0u);
  EXPECT_EQ(store_->flushes() - f0, 2u);
  EXPECT_EQ(c->Do(kCmdWriteZeroes, 0, 5, "", kCmdFlagFastZero).error, kEInval);  // Not advertised.
}

TEST_F(NbdServerTest, TwoExportsAreSeparateRanges) {
  server_.reset();
  uint64_t pages = 0;
  auto specs = LayOutExports({{"a", 2 * kPageSize + 1}, {"b", kPageSize}}, &pages);
  ASSERT_EQ(pages, 4u);
  EXPECT_EQ(specs[1].first_page, 3u);
  SetUpServer(specs, 4);
  auto ca = Connect();
  auto cb = Connect();
  ca->Go("a", false);
  cb->Go("b", false);
  EXPECT_EQ(cb->Do(kCmdWrite, 0, kPageSize, std::string(kPageSize, 'b')).error, 0u);
  EXPECT_EQ(ca->Do(kCmdWrite, 0, 2 * kPageSize + 1, std::string(2 * kPageSize + 1, 'a')).error, 0u);
  EXPECT_EQ(ca->Do(kCmdWrite, 2 * kPageSize + 1, 1, "x").error, kENoSpc);
  EXPECT_EQ(cb->Do(kCmdRead, 0, kPageSize).data, std::string(kPageSize, 'b'));
  EXPECT_EQ(store_->Page(3), std::vector<uint8_t>(kPageSize, 'b'));
  std::vector<uint8_t> p2 = store_->Page(2);
  EXPECT_EQ(p2[0], 'a');
  EXPECT_EQ(p2[1], 0);
}

}  // namespace
}  // namespace tessera::nbd
