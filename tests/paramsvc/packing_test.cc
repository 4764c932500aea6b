#include "apps/paramsvc/server/packing.h"

#include <gtest/gtest.h>

#include <numeric>

namespace tessera::paramsvc {
namespace {

std::vector<double> Loads(const std::vector<PackItem>& items, const PackResult& r) {
  std::vector<double> used(r.cores, 0.0);
  for (size_t i = 0; i < items.size(); ++i) used.at(r.core[i]) += items[i].load;
  return used;
}

TEST(ParamsvcPacking, FewestCoresUnderTheTarget) {
  std::vector<PackItem> items;
  for (double l : {0.3, 0.3, 0.2, 0.2, 0.1, 0.1, 0.05, 0.05}) items.push_back({l, -1});
  PackResult r = PackPartitions(items, 0.7, 8);
  EXPECT_EQ(r.cores, 2);  // 1.3 of load under 0.7 per core.
  for (double u : Loads(items, r)) EXPECT_LE(u, 0.7 + 1e-9);
}

TEST(ParamsvcPacking, StickyAssignmentsAvoidMoves) {
  std::vector<PackItem> items = {{0.2, 0}, {0.2, 1}, {0.2, 1}, {0.1, 0}};
  PackResult r = PackPartitions(items, 0.7, 4);
  EXPECT_EQ(r.cores, 2);
  EXPECT_EQ(r.moves, 0);
  EXPECT_EQ(r.core, (std::vector<int>{0, 1, 1, 0}));
}

TEST(ParamsvcPacking, ShrinksWhenLoadDropsAndOverloadsOnlyBeyondMaxCores) {
  std::vector<PackItem> items = {{0.1, 0}, {0.1, 1}, {0.1, 2}, {0.1, 3}};
  PackResult r = PackPartitions(items, 0.7, 4);
  EXPECT_EQ(r.cores, 1);
  EXPECT_EQ(r.moves, 3);
  std::vector<PackItem> heavy(5, PackItem{0.6, -1});
  r = PackPartitions(heavy, 0.7, 2);
  EXPECT_EQ(r.cores, 2);
  auto used = Loads(heavy, r);
  EXPECT_NEAR(used[0] + used[1], 3.0, 1e-9);
  EXPECT_LE(std::abs(used[0] - used[1]), 0.6 + 1e-9);  // Least-loaded overflow.
  std::vector<PackItem> big = {{1.5, -1}, {0.1, -1}};
  r = PackPartitions(big, 0.7, 4);
  EXPECT_EQ(r.cores, 2);  // A heavy partition gets a core of its own.
  EXPECT_NE(r.core[0], r.core[1]);
}

TEST(ParamsvcPacking, JobMovesRelieveTheOverloadedServerOntoTheEmptiestOne) {
  std::vector<ServerLoad> servers = {
      {"a", 1.0, {{"a1", 0.5}, {"a2", 0.4}, {"a3", 0.3}}},  // 1.2: overloaded
      {"b", 1.0, {{"b1", 0.3}}},
      {"c", 1.0, {}},  // Just added
  };
  auto plan = PlanJobMoves(servers, 0.8, 8);
  ASSERT_EQ(plan.size(), 1u);  // Then a is at 0.7, below 0.8.
  EXPECT_EQ(plan[0].job, "a1");
  EXPECT_EQ(plan[0].from, 0);
  EXPECT_EQ(plan[0].to, 2);
  // Spreading evenly goes on while a move lowers the larger utilisation of the pair.
  plan = PlanJobMoves(servers, 0.0, 8);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[1].job, "a3");
  EXPECT_EQ(plan[1].to, 1);
  EXPECT_EQ(PlanJobMoves(servers, 0.0, 1).size(), 1u);  // At most max_moves.
  // Capacities differ: a server of 4 cores takes more.
  std::vector<ServerLoad> sized = {{"small", 0.5, {{"x", 0.4}, {"y", 0.4}}}, {"big", 4.0, {}}};
  plan = PlanJobMoves(sized, 0.0, 8);
  ASSERT_EQ(plan.size(), 2u);  // small: 1.6 -> 0.8 -> 0; big: 0 -> 0.1 -> 0.2
  EXPECT_EQ(plan[1].to, 1);
  // Nothing to gain: a job that would only overload its destination as much, idle servers,
  // a single server.
  std::vector<ServerLoad> lump = {{"a", 1.0, {{"big", 1.5}}}, {"b", 1.0, {}}};
  EXPECT_TRUE(PlanJobMoves(lump, 0.8, 8).empty());
  std::vector<ServerLoad> idle = {{"a", 1.0, {{"j", 0.0}}}, {"b", 1.0, {}}};
  EXPECT_TRUE(PlanJobMoves(idle, 0.0, 8).empty());
  EXPECT_TRUE(PlanJobMoves({servers[0]}, 0.0, 8).empty());
}

}  // namespace
}  // namespace tessera::paramsvc
