// The Status matchers match what they say and print the status when they fail.
#include "tests/support/status_matchers.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

namespace tessera::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

Result<int> Value() { return 7; }
Result<int> Failure() { return DataLoss("page 4: only 3 of 6 members"); }

TEST(StatusMatchersTest, MatchWhatTheySay) {
  EXPECT_THAT(Status::Ok(), IsOk());
  EXPECT_THAT(Value(), IsOk());
  EXPECT_THAT(Failure(), Not(IsOk()));
  EXPECT_THAT(Failure(), StatusIs(StatusCode::kDataLoss));
  EXPECT_THAT(Failure(), StatusIs(StatusCode::kDataLoss, HasSubstr("page 4:")));
  EXPECT_THAT(Failure(), Not(StatusIs(StatusCode::kDataLoss, HasSubstr("page 5:"))));
  EXPECT_THAT(InvalidArgument("x"), Not(StatusIs(StatusCode::kDataLoss)));
}

TEST(StatusMatchersTest, FailuresPrintTheStatus) {
  EXPECT_NONFATAL_FAILURE(EXPECT_THAT(Failure(), IsOk()), "page 4: only 3 of 6 members");
  EXPECT_NONFATAL_FAILURE(EXPECT_THAT(Unavailable("server down"), StatusIs(StatusCode::kDataLoss)),
                          "server down");
}

}  // namespace
}  // namespace tessera::testing
