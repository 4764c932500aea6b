// Teardown order of the verbs handles (fabric/verbs_handles.h) without an RDMA device: the
// deleters go through a recording fake of the libibverbs/librdmacm calls.
#include "fabric/verbs_handles.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tessera::fabric {
namespace {

std::vector<std::string>* g_calls = nullptr;

void Record(const std::string& what) { g_calls->push_back(what); }

const VerbsApi kFakeApi = {
    [](rdma_cm_id* id) {
      Record(id->qp != nullptr ? "qp+id" : "id");
      return 0;
    },
    [](rdma_cm_id*) {
      Record("listen_id");
      return 0;
    },
    [](ibv_cq*) {
      Record("cq");
      return 0;
    },
    [](ibv_comp_channel*) {
      Record("comp_channel");
      return 0;
    },
    [](ibv_mr*) {
      Record("mr");
      return 0;
    },
    [](ibv_pd*) {
      Record("pd");
      return 0;
    },
    [](rdma_event_channel*) { Record("event_channel"); },
    [](ibv_context**) { Record("devices"); },
};

class VerbsHandlesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_calls = &calls_;
    SetVerbsApiForTesting(&kFakeApi);
  }
  void TearDown() override {
    SetVerbsApiForTesting(nullptr);
    g_calls = nullptr;
  }
  // Stand-ins for the handles: never dereferenced by the fake, except the id's qp field.
  ibv_qp qp_{};
  rdma_cm_id qp_ids_[2]{};
  rdma_cm_id listen_{};
  ibv_cq cq_{};
  ibv_comp_channel comp_{};
  ibv_mr mrs_[2]{};
  ibv_pd pd_{};
  rdma_event_channel channel_{};
  ibv_context* devices_[2]{};
  std::vector<std::string> calls_;
};

TEST_F(VerbsHandlesTest, EverythingGoesQpCqMrPdThenTheRest) {
  {
    VerbsResources r;
    // Acquired in the order Init() acquires them.
    r.devices.reset(devices_);
    r.event_channel.reset(&channel_);
    r.listen_id.reset(&listen_);
    r.pd.reset(&pd_);
    r.mrs.emplace_back(&mrs_[0]);
    r.mrs.emplace_back(&mrs_[1]);
    r.comp_channel.reset(&comp_);
    r.cq.reset(&cq_);
    qp_ids_[0].qp = &qp_;
    qp_ids_[1].qp = &qp_;
    r.qps.emplace_back(&qp_ids_[0]);
    r.qps.emplace_back(&qp_ids_[1]);
    EXPECT_TRUE(calls_.empty());
  }
  EXPECT_EQ(calls_, (std::vector<std::string>{"qp+id", "qp+id", "cq", "comp_channel", "mr", "mr",
                                              "pd", "listen_id", "event_channel", "devices"}));
}

TEST_F(VerbsHandlesTest, ResetTearsDownOnceAndTheDestructorDoesNothingMore) {
  {
    VerbsResources r;
    r.devices.reset(devices_);
    r.pd.reset(&pd_);
    r.cq.reset(&cq_);
    r.Reset();
    EXPECT_EQ(calls_, (std::vector<std::string>{"cq", "pd", "devices"}));
  }
  EXPECT_EQ(calls_.size(), 3u);
}

TEST_F(VerbsHandlesTest, AFailedInitReleasesOnlyWhatItGot) {
  {
    VerbsResources r;  // Init stopped after the PD (e.g. ibv_create_comp_channel failed).
    r.devices.reset(devices_);
    r.pd.reset(&pd_);
  }
  EXPECT_EQ(calls_, (std::vector<std::string>{"pd", "devices"}));
}

TEST_F(VerbsHandlesTest, AnIdWithoutAQueuePairIsDestroyedAlone) {
  {
    QpIdPtr refused(&qp_ids_[0]);  // A connect request refused before rdma_create_qp.
  }
  EXPECT_EQ(calls_, (std::vector<std::string>{"id"}));
}

TEST_F(VerbsHandlesTest, QueuePairsHeldOutsideGoFirstWhenDeclaredAfter) {
  // The transport keeps its QPs in per-connection state declared after its VerbsResources:
  // members are destroyed in reverse order, so the QPs still go before the CQ.
  struct Owner {
    VerbsResources res;
    std::vector<QpIdPtr> conns;
  };
  {
    Owner o;
    o.res.pd.reset(&pd_);
    o.res.cq.reset(&cq_);
    qp_ids_[0].qp = &qp_;
    o.conns.emplace_back(&qp_ids_[0]);
  }
  EXPECT_EQ(calls_, (std::vector<std::string>{"qp+id", "cq", "pd"}));
}

}  // namespace
}  // namespace tessera::fabric
