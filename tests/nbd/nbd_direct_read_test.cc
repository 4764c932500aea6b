// Run-to-completion READs of the NBD export (NbdServerOptions::direct_reads): an NbdServer in
// this process over a real group-layout (and split-layout) store on real memservers, driven by
// a real NBD client (libnbd's Python bindings, the distribution's /usr/bin/python3) with 32
// reads in flight.
// Covered: READs are read on the connection's reader thread (PageStoreStats::direct_reads) and
// the option turns that off; data identical to what was written, also while another connection
// rewrites the pages (buffered and moving pages fall back); a memserver SIGKILLed while reading;
// a SIGSTOPped server (hedge time: handed over degraded); corrupted replies (CRC mismatch: fall
// back and repair).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "client/local_cluster.h"
#include "client/remote_store.h"
#include "client/testing/fault_injecting_transport.h"
#include "common/subprocess.h"
#include "kernel_shim/nbd/nbd_server.h"
#include "tests/support/status_matchers.h"
#include "tests/support/test_util.h"

namespace tessera::nbd {
namespace {

using ::tessera::testing::IsOk;

constexpr uint64_t kPages = 512;

// The client: fill (version v of every page), read passes at QD32 checking every byte, and a
// mixed run (a second connection rewrites every page while the first reads). Page p version v
// holds pack('<QQ', p, v) repeated; a read must be a whole version of the right page.
constexpr const char* kDriver = R"PY(
import os, random, struct, sys, threading, time
import nbd
PAGE = 4096
uri, pages, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def content(p, v):
    return struct.pack('<QQ', p, v) * (PAGE // 16)
def version(p, b):
    q, v = struct.unpack_from('<QQ', b, 0)
    return v if q == p and b == content(p, v) else -1
def connect():
    h = nbd.NBD()
    h.connect_uri(uri)
    return h
def read_pass(h, rng, ok, qd=32):
    order = list(range(pages))
    rng.shuffle(order)
    inflight, bad, i = {}, 0, 0
    while i < len(order) or inflight:
        while i < len(order) and len(inflight) < qd:
            p = order[i]
            i += 1
            buf = nbd.Buffer(PAGE)
            inflight[h.aio_pread(buf, p * PAGE)] = (p, buf)
        h.poll(-1)
        for c in list(inflight):
            if not h.aio_command_completed(c):
                continue
            p, buf = inflight.pop(c)
            if version(p, bytes(buf.to_bytearray())) not in ok:
                bad += 1
    return bad
def stable_reads(h, rng, v):
    # Multi-page and unaligned READs of stable data.
    bad = 0
    for _ in range(8):
        p = rng.randrange(pages - 16)
        data = h.pread(16 * PAGE, p * PAGE)
        bad += sum(version(p + j, data[j * PAGE:(j + 1) * PAGE]) != v for j in range(16))
        off = rng.randrange(1, PAGE - 1)
        bad += h.pread(PAGE + 100, p * PAGE + off) != data[off:off + PAGE + 100]
    return bad
rng = random.Random(7)
h = connect()
bad = 0
if mode == 'fill':
    v = int(sys.argv[4])
    for base in range(0, pages, 64):
        n = min(64, pages - base)
        h.pwrite(b''.join(content(p, v) for p in range(base, base + n)), base * PAGE)
    h.flush()
elif mode == 'read':
    # Passes until the file argv[5] exists, then argv[6] more passes (bounded: 150 s).
    v, until, after = int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
    t0, n = time.time(), 0
    while True:
        bad += read_pass(h, rng, {v}) + stable_reads(h, rng, v)
        n += 1
        print('PASS %d bad %d' % (n, bad), flush=True)
        if until == '-' or os.path.exists(until):
            after -= 1
            if after <= 0:
                break
        if time.time() - t0 > 150:
            sys.exit('timed out waiting for ' + until)
elif mode == 'mixed':
    # A second connection writes version 2 of every page while this one reads (1 or 2).
    def writer():
        w = connect()
        for base in range(0, pages, 4):
            w.pwrite(b''.join(content(p, 2) for p in range(base, base + 4)), base * PAGE)
        w.flush()
        w.shutdown()
    t = threading.Thread(target=writer)
    t.start()
    while t.is_alive():
        bad += read_pass(h, rng, {1, 2})
    t.join()
    bad += read_pass(h, rng, {2}) + stable_reads(h, rng, 2)
h.shutdown()
print('BAD %d' % bad, flush=True)
sys.exit(1 if bad else 0)
)PY";

bool HaveLibnbd() {
  return ::tessera::testing::RunCommand({"/usr/bin/python3", "-c", "import nbd"}, 30000)
             .exit_code == 0;
}

#define REQUIRE_LIBNBD()                                                                     \
  do {                                                                                       \
    if (!HaveLibnbd()) GTEST_SKIP() << "python3-libnbd is not installed (scripts/setup.sh)"; \
  } while (0)

// A cluster, a group-layout store on it and an NbdServer in this process.
class Export {
 public:
  struct Options {
    bool direct = true;
    client::EcLayout layout = client::EcLayout::kGroup;
    uint32_t hedge_us = 1000000;  // A loaded machine's hiccup is not a straggler by default.
    std::function<Result<std::unique_ptr<fabric::Transport>>(const fabric::TransportOptions&)>
        factory;
    uint32_t op_timeout_ms = 2000;
    uint32_t heartbeat_timeout_ms = 1000;
  };
  explicit Export(const Options& o) {
    client::LocalClusterOptions lo;
    lo.bin_dir = ::tessera::testing::BinDir();
    lo.servers = 7;  // RS(4,2) and one spare for a killed server's members.
    lo.capacity = "16M";
    lo.slab_size = "256K";
    auto c = client::LocalCluster::Start(lo);
    EXPECT_THAT(c, IsOk());
    if (!c.ok()) return;
    cluster = std::move(*c);
    client::ErasureCodedStoreOptions eo;
    for (const auto& e : cluster->endpoints()) eo.remote.servers.push_back({e, ""});
    eo.remote.secret = cluster->secret();
    eo.remote.transport = fabric::TransportKind::kTcp;
    eo.remote.capacity_pages = kPages;
    eo.remote.direct_reads = o.direct;
    eo.remote.transport_factory = o.factory;
    eo.remote.op_timeout_ms = o.op_timeout_ms;
    eo.remote.heartbeat_timeout_ms = o.heartbeat_timeout_ms;
    eo.k = 4;
    eo.r = 2;
    eo.layout = o.layout;
    eo.group.hedge_us = o.hedge_us;
    auto s = client::CreateErasureCodedStore(eo);
    EXPECT_THAT(s, IsOk());
    if (!s.ok()) return;
    store = std::move(*s);
    NbdServerOptions so;
    uint64_t total = 0;
    so.exports = LayOutExports({{"t", kPages * client::kPageSize}}, &total);
    so.direct_reads = o.direct;
    auto srv = NbdServer::Create(store.get(), so);
    EXPECT_THAT(srv, IsOk());
    if (!srv.ok()) return;
    server = std::move(*srv);
    auto port = server->ListenTcp("127.0.0.1", 0);
    EXPECT_THAT(port, IsOk());
    if (!port.ok()) return;
    EXPECT_THAT(server->Start(), IsOk());
    uri = "nbd://127.0.0.1:" + std::to_string(*port) + "/t";
  }
  ~Export() {
    if (server) {
      EXPECT_THAT(server->Shutdown(), IsOk());
    }
    server.reset();
    store.reset();
  }
  bool ok() const { return !uri.empty(); }

  // Runs the driver to completion; its exit code (0: every byte as expected).
  int Run(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"/usr/bin/python3", "-c", kDriver, uri,
                                     std::to_string(kPages)};
    argv.insert(argv.end(), args.begin(), args.end());
    auto o = ::tessera::testing::RunCommand(argv, 240000, true);
    EXPECT_EQ(o.exit_code, 0) << o.stdout_text;
    return o.exit_code;
  }

  std::unique_ptr<client::LocalCluster> cluster;
  std::unique_ptr<client::PageStore> store;
  std::unique_ptr<NbdServer> server;
  std::string uri;
};

void ReadsOnTheConnectionThread(client::EcLayout layout, bool direct) {
  SCOPED_TRACE(direct ? "direct_reads" : "no direct_reads");
  {
    Export e({.direct = direct, .layout = layout});
    ASSERT_TRUE(e.ok());
    ASSERT_EQ(e.Run({"fill", "1"}), 0);
    const client::PageStoreStats before = e.store->Stats();
    ASSERT_EQ(e.Run({"read", "1", "-", "2"}), 0);  // Two passes of 512 pages, then 32+ more.
    const client::PageStoreStats st = e.store->Stats();
    if (direct) {
      // Every page of the passes was stored and sealed (after a FLUSH): read on the connection
      // thread, but for a connection attempt that failed on a very loaded machine, and reads
      // hedged on the I/O thread because their servers did not answer within the hedge time
      // (memservers descheduled for seconds).
      const uint64_t hedged = st.direct_hedged - before.direct_hedged;
      EXPECT_GE(st.direct_reads - before.direct_reads + hedged, 2 * kPages - 16);
      EXPECT_GE(st.direct_reads - before.direct_reads, kPages);
      EXPECT_LE(st.direct_fallbacks - before.direct_fallbacks - hedged, 16u);
    } else {
      EXPECT_EQ(st.direct_reads, 0u);
      EXPECT_EQ(st.direct_fallbacks, 0u);
    }
    // Pages being rewritten by another connection: old or new, never anything else.
    ASSERT_EQ(e.Run({"mixed"}), 0);
    const client::PageStoreStats end = e.store->Stats();
    EXPECT_EQ(end.data_loss, 0u);
    EXPECT_EQ(end.read_errors, 0u);
    EXPECT_EQ(e.server->Stats().errors_replied, 0u);
  }
}

TEST(NbdDirectReadTest, ReadsRunOnTheConnectionThreadAndTheOptionTurnsThemOff) {
  REQUIRE_LIBNBD();
  ReadsOnTheConnectionThread(client::EcLayout::kGroup, true);
  ReadsOnTheConnectionThread(client::EcLayout::kGroup, false);
}

// The split layout: each page read is k + delta split reads on the connection's transport,
// assembled or decoded there.
TEST(NbdDirectReadTest, SplitLayoutReadsRunOnTheConnectionThread) {
  REQUIRE_LIBNBD();
  ReadsOnTheConnectionThread(client::EcLayout::kSplit, true);
}

// A memserver SIGKILLed while the client reads at QD32: every READ still returns the data
// written; reads of its pages fall back to the I/O thread (degraded), others stay direct.
void KilledWhileReading(client::EcLayout layout) {
  Export e({.layout = layout, .hedge_us = 2000});
  ASSERT_TRUE(e.ok());
  ASSERT_EQ(e.Run({"fill", "3"}), 0);
  auto servers = e.store->ServersOfPage(0);
  ASSERT_THAT(servers, IsOk());
  ::tessera::testing::TempDir dir;
  const std::string flag = dir.path() + "/killed";
  auto p = Subprocess::Start({"/usr/bin/python3", "-c", kDriver, e.uri, std::to_string(kPages),
                              "read", "3", flag, "2"},
                             {.capture_stdout = true});
  ASSERT_THAT(p, IsOk());
  ASSERT_THAT(p->WaitForLine("PASS 1", Deadline::AfterMs(60000)), IsOk());
  const uint64_t direct_before = e.store->Stats().direct_reads;
  ASSERT_THAT(e.cluster->Kill((*servers)[0]), IsOk());
  std::ofstream(flag) << "1";  // Two more whole passes after the kill, then the driver exits.
  auto rc = p->Wait(Deadline::AfterMs(180000));
  ASSERT_THAT(rc, IsOk());
  EXPECT_TRUE(WIFEXITED(*rc) && WEXITSTATUS(*rc) == 0) << "wrong bytes or errors after the kill";
  const client::PageStoreStats st = e.store->Stats();
  EXPECT_GT(direct_before, 0u);
  EXPECT_GT(st.direct_reads, direct_before) << "pages on live servers are still read directly";
  if (layout == client::EcLayout::kGroup) {
    EXPECT_GE(st.direct_fallbacks, 1u) << "pages of the killed server must fall back";
  }  // (Split: a page with one split lost is decoded from the others on the reader's thread.)
  EXPECT_GE(st.degraded_reads, 1u);
  EXPECT_EQ(st.data_loss, 0u);
  EXPECT_EQ(e.server->Stats().errors_replied, 0u);
}

TEST(NbdDirectReadTest, MemserverKilledWhileReading) {
  REQUIRE_LIBNBD();
  KilledWhileReading(client::EcLayout::kGroup);
}

TEST(NbdDirectReadTest, SplitLayoutMemserverKilledWhileReading) {
  REQUIRE_LIBNBD();
  KilledWhileReading(client::EcLayout::kSplit);
}

// A SIGSTOPped server never answers: its pages' direct reads are handed over (degraded) after
// the hedge time, and the reads stay correct and bounded.
TEST(NbdDirectReadTest, StoppedServerReadsAreHandedOverAfterTheHedgeTime) {
  REQUIRE_LIBNBD();
  // (Once, under a load average of 7, an I/O-thread read of a handed-over page waited for the
  // op timeout and the server was declared failed: the data stays right either way, so the op
  // timeout is kept short enough to bound the test and a failure declaration is tolerated.)
  Export e({.hedge_us = 5000, .op_timeout_ms = 10000, .heartbeat_timeout_ms = 60000});
  ASSERT_TRUE(e.ok());
  ASSERT_EQ(e.Run({"fill", "4"}), 0);
  auto servers = e.store->ServersOfPage(0);
  ASSERT_THAT(servers, IsOk());
  ASSERT_THAT(e.cluster->Stop((*servers)[0]), IsOk());
  const uint64_t t0 = MonotonicNs();
  const int rc = e.Run({"read", "4", "-", "1"});
  const double secs = static_cast<double>(MonotonicNs() - t0) / 1e9;
  ASSERT_THAT(e.cluster->Cont((*servers)[0]), IsOk());
  EXPECT_EQ(rc, 0);
  EXPECT_LT(secs, 60.0);
  const client::PageStoreStats st = e.store->Stats();
  EXPECT_GE(st.direct_fallbacks, 1u);
  EXPECT_GE(st.degraded_reads, 1u);
  EXPECT_GT(st.direct_reads, 0u);
  EXPECT_EQ(st.data_loss, 0u);
}

// Replies of one server are corrupted in the client's transports (the connection reader's
// too): a CRC mismatch hands the page to the I/O thread, which decodes it and repairs.
TEST(NbdDirectReadTest, CrcMismatchFallsBackAndIsRepaired) {
  REQUIRE_LIBNBD();
  auto faults = std::make_shared<client::testing::TransportFaults>();
  Export e({.factory = client::testing::FaultInjectingFactory(faults)});
  ASSERT_TRUE(e.ok());
  ASSERT_EQ(e.Run({"fill", "5"}), 0);
  auto servers = e.store->ServersOfPage(0);
  ASSERT_THAT(servers, IsOk());
  const std::string bad = e.cluster->endpoints()[(*servers)[0]].ToString();
  faults->CorruptReadsFrom(bad, true);
  const int rc = e.Run({"read", "5", "-", "1"});
  faults->CorruptReadsFrom(bad, false);
  EXPECT_EQ(rc, 0);
  const client::PageStoreStats st = e.store->Stats();
  EXPECT_GE(faults->reads_corrupted.load(), 1u);
  EXPECT_GE(st.direct_fallbacks, 1u);
  EXPECT_GE(st.corruptions_detected, 1u);
  EXPECT_GT(st.direct_reads, 0u);
  EXPECT_EQ(st.data_loss, 0u);
  EXPECT_EQ(e.server->Stats().errors_replied, 0u);
}

TEST(NbdDirectReadTest, BadSpinIsRefused) {
  NbdServerOptions so;
  so.exports = {ExportSpec{"x", "", 4096, 0}};
  so.direct_spin_us = 1001;
  // Any store will do for option checks: the export must fit, so give it one page.
  struct OnePage : client::PageStore {
    std::string name() const override { return "one"; }
    uint64_t capacity_pages() const override { return 1; }
    double memory_overhead() const override { return 1; }
    Status Submit(std::span<client::PageOp* const>) override { return Unavailable("no"); }
    Status Trim(client::PageId, uint64_t) override { return Status::Ok(); }
    Status Flush() override { return Status::Ok(); }
    client::PageStoreStats Stats() const override { return {}; }
  } store;
  auto s = NbdServer::Create(&store, so);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  so.direct_spin_us = 1000;
  EXPECT_THAT(NbdServer::Create(&store, so), IsOk());
}

}  // namespace
}  // namespace tessera::nbd
