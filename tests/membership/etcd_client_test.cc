// EtcdClient / EtcdWatch against a real etcd (Debian's /usr/bin/etcd) on loopback.
#include "membership/etcd_client.h"

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>

#include <gtest/gtest.h>

#include "common/clock.h"
#include "tests/support/etcd_process.h"
#include "tests/support/status_matchers.h"

namespace tessera::membership {
namespace {

using ::tessera::testing::EtcdProcess;
using ::tessera::testing::IsOk;

// A port nothing listens on: bound to an ephemeral port and closed again... simpler: port 1 on
// loopback is never served in the test environment (connection refused at once).
constexpr const char* kDeadEndpoint = "127.0.0.1:1";

class EtcdClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = EtcdProcess::SkipReason(); !why.empty()) GTEST_SKIP() << why;
    auto e = EtcdProcess::Start();
    ASSERT_TRUE(e.ok()) << e.status();
    etcd_ = std::move(*e);
    EtcdOptions o;
    o.endpoints = {etcd_->endpoint()};
    auto c = EtcdClient::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }

  std::unique_ptr<EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> client_;
};

// The state a watch reconstructs (snapshot + events), with bounded waits on it.
struct WatchedState {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::string> kv;
  uint64_t snapshots = 0;
  uint64_t errors = 0;

  EtcdWatch::Callbacks Callbacks() {
    EtcdWatch::Callbacks cb;
    cb.on_snapshot = [this](const RangeResult& r) {
      std::lock_guard<std::mutex> l(mu);
      kv.clear();
      for (const auto& e : r.kvs) kv[e.key] = e.value;
      ++snapshots;
      cv.notify_all();
    };
    cb.on_events = [this](const std::vector<WatchEvent>& events) {
      std::lock_guard<std::mutex> l(mu);
      for (const auto& e : events) {
        if (e.type == WatchEvent::Type::kPut) {
          kv[e.kv.key] = e.kv.value;
        } else {
          kv.erase(e.kv.key);
        }
      }
      cv.notify_all();
    };
    cb.on_error = [this](const Status&) {
      std::lock_guard<std::mutex> l(mu);
      ++errors;
      cv.notify_all();
    };
    return cb;
  }
  // Waits (bounded) until pred(kv) holds.
  template <typename Pred>
  bool WaitFor(Pred pred, int ms = 10000) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, std::chrono::milliseconds(ms), [&] { return pred(kv); });
  }
};

TEST(EtcdEndpointsTest, ParsesListsAndRejectsBadOnes) {
  auto e = ParseEtcdEndpoints("127.0.0.1:2379, http://h:1,https://x:3");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(*e, (std::vector<std::string>{"http://127.0.0.1:2379", "http://h:1", "https://x:3"}));
  EXPECT_EQ(ParseEtcdEndpoints("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseEtcdEndpoints(",,").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseEtcdEndpoints("host").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseEtcdEndpoints("host:x1").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PrefixEnd("/a/"), "/a0");
  EXPECT_EQ(PrefixEnd(std::string("a\xff", 2)), "b");
}

TEST(EtcdUnreachableTest, ClearErrorNamingEveryEndpoint) {
  EtcdOptions o;
  o.endpoints = {kDeadEndpoint, "127.0.0.1:2"};
  o.connect_timeout_ms = 300;
  o.request_timeout_ms = 300;
  auto c = EtcdClient::Create(o);
  ASSERT_TRUE(c.ok());
  const uint64_t t0 = MonotonicNs();
  auto r = (*c)->Get("/x");
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("etcd unreachable"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("127.0.0.1:1"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("127.0.0.1:2"), std::string::npos) << r.status();
  EXPECT_LT(MonotonicNs() - t0, 5'000'000'000ull) << "timeouts not bounded";
  EXPECT_EQ(EtcdClient::Create(EtcdOptions{}).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(EtcdClientTest, PutGetPrefixDelete) {
  ASSERT_THAT(client_->Put("/t/a", "one"), IsOk());
  ASSERT_THAT(client_->Put("/t/b", std::string("bin\0ary\xff", 8)), IsOk());
  ASSERT_THAT(client_->Put("/u/c", "other"), IsOk());
  auto one = client_->Get("/t/a");
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->kvs.size(), 1u);
  EXPECT_EQ(one->kvs[0].value, "one");
  EXPECT_GT(one->revision, 0);
  auto all = client_->GetPrefix("/t/");
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->kvs.size(), 2u);
  EXPECT_EQ(all->kvs[0].key, "/t/a");
  EXPECT_EQ(all->kvs[1].value, std::string("bin\0ary\xff", 8));
  auto d = client_->Delete("/t/a");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, 1);
  EXPECT_EQ(*client_->Delete("/t/a"), 0);
  EXPECT_TRUE(client_->Get("/t/a")->kvs.empty());
  EXPECT_EQ(client_->GetPrefix("/t/")->kvs.size(), 1u);
}

TEST_F(EtcdClientTest, LeaseKeepsKeyAliveAndExpiryRemovesIt) {
  auto lease = client_->GrantLease(2);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_THAT(client_->Put("/l/k", "v", *lease), IsOk());
  EXPECT_EQ(client_->Get("/l/k")->kvs.at(0).lease, *lease);
  auto ttl = client_->KeepAlive(*lease);
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  EXPECT_GE(*ttl, 1);
  // Stop refreshing: a watch sees the key go once the lease expires (~2 s; bounded at 10 s).
  WatchedState w;
  auto watch = EtcdWatch::Start(client_->options(), "/l/", w.Callbacks());
  ASSERT_TRUE(watch.ok()) << watch.status();
  ASSERT_TRUE(w.WaitFor([](auto& kv) { return kv.count("/l/k") == 1; }));
  ASSERT_TRUE(w.WaitFor([](auto& kv) { return kv.empty(); }, 10000))
      << "the key outlived its lease";
  EXPECT_EQ(client_->KeepAlive(*lease).status().code(), StatusCode::kNotFound);
  // Revoking deletes at once.
  auto l2 = client_->GrantLease(30);
  ASSERT_TRUE(l2.ok());
  ASSERT_THAT(client_->Put("/l/r", "v", *l2), IsOk());
  ASSERT_THAT(client_->RevokeLease(*l2), IsOk());
  EXPECT_TRUE(client_->Get("/l/r")->kvs.empty());
  EXPECT_EQ(client_->Put("/l/x", "v", 12345).code(), StatusCode::kNotFound);
  EXPECT_EQ(client_->GrantLease(0).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(EtcdClientTest, WatchSeesSnapshotThenChanges) {
  ASSERT_THAT(client_->Put("/w/before", "1"), IsOk());
  WatchedState w;
  auto watch = EtcdWatch::Start(client_->options(), "/w/", w.Callbacks());
  ASSERT_TRUE(watch.ok()) << watch.status();
  ASSERT_TRUE(w.WaitFor([](auto& kv) { return kv.count("/w/before") == 1; }));
  ASSERT_THAT(client_->Put("/w/after", "2"), IsOk());
  ASSERT_THAT(client_->Put("/other", "x"), IsOk());
  ASSERT_TRUE(w.WaitFor([](auto& kv) { return kv.count("/w/after") == 1; }));
  ASSERT_THAT(client_->Put("/w/after", "3"), IsOk());
  ASSERT_TRUE(w.WaitFor([](auto& kv) { return kv.count("/w/after") && kv.at("/w/after") == "3"; }));
  ASSERT_TRUE(client_->Delete("/w/before").ok());
  ASSERT_TRUE(w.WaitFor([](auto& kv) { return kv.count("/w/before") == 0; }));
  std::lock_guard<std::mutex> l(w.mu);
  EXPECT_EQ(w.kv.count("/other"), 0u);
  EXPECT_EQ(w.snapshots, 1u);
}

TEST_F(EtcdClientTest, FailsOverToTheNextEndpoint) {
  EtcdOptions o;
  o.endpoints = {kDeadEndpoint, etcd_->endpoint()};
  o.connect_timeout_ms = 500;
  auto c = EtcdClient::Create(o);
  ASSERT_TRUE(c.ok());
  ASSERT_THAT((*c)->Put("/f/k", "v"), IsOk());
  EXPECT_EQ((*c)->current_endpoint(), "http://" + etcd_->endpoint());
  EXPECT_EQ((*c)->Get("/f/k")->kvs.at(0).value, "v");
  // A watch given the dead endpoint first also finds the live one.
  WatchedState w;
  auto watch = EtcdWatch::Start(o, "/f/", w.Callbacks());
  ASSERT_TRUE(watch.ok());
  ASSERT_TRUE(w.WaitFor([](auto& kv) { return kv.count("/f/k") == 1; }));
}

TEST_F(EtcdClientTest, WatchResumesAfterEtcdRestartsAndMissesNothing) {
  WatchedState w;
  auto watch = EtcdWatch::Start(client_->options(), "/r/", w.Callbacks(), 100);
  ASSERT_TRUE(watch.ok());
  ASSERT_THAT(client_->Put("/r/1", "a"), IsOk());
  ASSERT_TRUE(w.WaitFor([](auto& kv) { return kv.count("/r/1") == 1; }));
  ASSERT_THAT(etcd_->Kill(), IsOk());
  // etcd down: calls fail with a clear error, the watch keeps retrying.
  EXPECT_EQ(client_->Get("/r/1").status().code(), StatusCode::kUnavailable);
  ASSERT_TRUE(w.WaitFor([&](auto&) { return w.errors > 0; })) << "the watch did not notice";
  ASSERT_THAT(etcd_->Restart(), IsOk());
  // Changes made while the watch was reconnecting are in its next snapshot or stream.
  ASSERT_THAT(client_->Put("/r/2", "b"), IsOk());
  ASSERT_TRUE(client_->Delete("/r/1").ok());
  ASSERT_TRUE(w.WaitFor([](auto& kv) { return kv.size() == 1 && kv.count("/r/2") == 1; }))
      << "the watch did not resume";
  EXPECT_GE((*watch)->snapshots(), 2u);
}

}  // namespace
}  // namespace tessera::membership
