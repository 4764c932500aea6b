// gmock matchers for Status and Result<T> that print the status when they fail:
//   EXPECT_THAT(store->Flush(), IsOk());
//   ASSERT_THAT(CreateErasureCodedStore(o), IsOk());
//   EXPECT_THAT(ParseEcLayout("x"), StatusIs(StatusCode::kInvalidArgument));
//   EXPECT_THAT(st, StatusIs(StatusCode::kDataLoss, ::testing::HasSubstr("page 4:")));
// (EXPECT_TRUE(x.ok()) prints only "false".)
#pragma once

#include <gmock/gmock.h>

#include <ostream>
#include <string>

#include "common/status.h"

namespace tessera::testing {

namespace internal_status {

inline const Status& GetStatus(const Status& s) { return s; }
template <typename T>
const Status& GetStatus(const Result<T>& r) {
  return r.status();
}

}  // namespace internal_status

// Matches an OK Status or a Result<T> holding a value.
MATCHER(IsOk, negation ? "is not OK" : "is OK") {
  const Status& s = internal_status::GetStatus(arg);
  if (!s.ok()) *result_listener << "which is " << s.ToString();
  return s.ok();
}

// Matches a Status (or a Result's status) with `code` and, optionally, a message matching
// `message_matcher`.
MATCHER_P(StatusIs, code,
          std::string(negation ? "does not have" : "has") + " code " +
              std::string(StatusCodeName(code))) {
  const Status& s = internal_status::GetStatus(arg);
  *result_listener << "which is " << s.ToString();
  return s.code() == code;
}

MATCHER_P2(StatusIs, code, message_matcher,
           std::string(negation ? "does not have" : "has") + " code " +
               std::string(StatusCodeName(code)) + " and a message that " +
               ::testing::DescribeMatcher<std::string>(message_matcher, negation)) {
  const Status& s = internal_status::GetStatus(arg);
  *result_listener << "which is " << s.ToString();
  return s.code() == code &&
         ::testing::Matches(::testing::SafeMatcherCast<std::string>(message_matcher))(s.message());
}

}  // namespace tessera::testing
