#include "common/status.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <memory>

namespace tessera {
namespace {

Result<int> Half(int v) {
  if (v % 2) return InvalidArgument("odd value ", v);
  return v / 2;
}

Result<int> Quarter(int v) {
  TESSERA_ASSIGN_OR_RETURN(int h, Half(v));
  TESSERA_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckPositive(int v) {
  if (v <= 0) return OutOfRange("v=", v, " must be positive");
  return Status::Ok();
}

Status Both(int a, int b) {
  TESSERA_RETURN_IF_ERROR(CheckPositive(a));
  TESSERA_RETURN_IF_ERROR(CheckPositive(b));
  return Status::Ok();
}

TEST(StatusTest, OkAndErrors) {
  Status ok;
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.ToString(), "OK");
  Status bad = InvalidArgument("k=", 5, " does not divide 4096");
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "k=5 does not divide 4096");
  EXPECT_EQ(bad.ToString(), "InvalidArgument: k=5 does not divide 4096");
  EXPECT_EQ(bad.WithContext("codec").message(), "codec: k=5 does not divide 4096");
}

TEST(StatusTest, ReturnIfError) {
  EXPECT_TRUE(Both(1, 2).ok());
  Status s = Both(1, -2);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(s.message(), "v=-2 must be positive");
}

TEST(StatusTest, ResultValueAndError) {
  auto q = Quarter(12);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(*q, 3);
  auto bad = Quarter(6);  // 6 -> 3 -> odd
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "odd value 3");
  EXPECT_EQ(bad.value_or(-1), -1);
}

TEST(StatusTest, ResultFromOkStatusIsAnError) {
  Result<int> r{Status::Ok()};
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(StatusTest, ResultMoveOnly) {
  Result<std::unique_ptr<int>> r(std::make_unique<int>(7));
  ASSERT_TRUE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 7);
}

TEST(StatusTest, ErrnoErrorNamesTheCall) {
  errno = ENOENT;
  Status s = ErrnoError("open ", "/nope");
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("open /nope: No such file or directory"), std::string::npos)
      << s.message();
}

TEST(StatusDeathTest, ValueOfErrorAborts) {
  Result<int> r = InvalidArgument("nope");
  EXPECT_DEATH({ (void)r.value(); }, "value\\(\\) called on a failed Result: InvalidArgument: nope");
}

}  // namespace
}  // namespace tessera
