// common/coding.h: the byte layout is little-endian and fixed, the cursors keep field order,
// and a short or over-long input is an error that names the field.
#include "common/coding.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(Coding, FixedWidthIsLittleEndian) {
  uint8_t b[8];
  EncodeFixed16(b, 0x0201);
  EXPECT_EQ(b[0], 1);
  EXPECT_EQ(b[1], 2);
  EncodeFixed32(b, 0x04030201u);
  EXPECT_EQ((std::vector<uint8_t>(b, b + 4)), (std::vector<uint8_t>{1, 2, 3, 4}));
  EncodeFixed64(b, 0x0807060504030201ull);
  EXPECT_EQ((std::vector<uint8_t>(b, b + 8)), (std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(DecodeFixed64(b), 0x0807060504030201ull);
  EXPECT_EQ(DecodeFixed32(b), 0x04030201u);
  EXPECT_EQ(DecodeFixed16(b), 0x0201);
  for (uint64_t v : {0ull, 1ull, 0x80ull, 0xffffffffull, 0x8000000000000000ull, ~0ull}) {
    EncodeFixed64(b, v);
    EXPECT_EQ(DecodeFixed64(b), v);
  }
}

TEST(Coding, BigEndianIsNetworkOrder) {
  uint8_t b[8];
  EncodeBigEndian16(b, 0x0102);
  EXPECT_EQ(b[0], 0x01);
  EXPECT_EQ(b[1], 0x02);
  EncodeBigEndian32(b, 0x01020304u);
  EXPECT_EQ(std::vector<uint8_t>(b, b + 4), (std::vector<uint8_t>{1, 2, 3, 4}));
  EXPECT_EQ(DecodeBigEndian32(b), 0x01020304u);
  EncodeBigEndian64(b, 0x0102030405060708ull);
  EXPECT_EQ(std::vector<uint8_t>(b, b + 8), (std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(DecodeBigEndian64(b), 0x0102030405060708ull);
  EXPECT_EQ(DecodeBigEndian16(b), 0x0102);
  // NBD's greeting: "NBDMAGIC" is the 64-bit magic in network order.
  ByteWriter w;
  w.PutBigEndian64(0x4e42444d41474943ull).PutBigEndian16(3).PutBytes(std::string_view("x"));
  EXPECT_EQ(w.TakeString(), std::string("NBDMAGIC\x00\x03x", 11));
  const std::string hdr("\x25\x60\x95\x13\x00\x01", 6);
  SpanReader r(AsBytes(hdr));
  EXPECT_EQ(r.GetBigEndian32("magic"), 0x25609513u);
  EXPECT_EQ(r.GetBigEndian16("flags"), 1u);
  EXPECT_EQ(r.GetBigEndian16("type"), 0u);
  EXPECT_NE(r.status().ToString().find("type needs 2 bytes, 0 left"), std::string::npos)
      << r.status().ToString();
}

TEST(Coding, WritersAndReaderRoundTripInOrder) {
  uint8_t fixed[8 + 4 + 2 + 1 + 3 + 4];
  SpanWriter(fixed, sizeof fixed)
      .PutFixed64(0x1122334455667788ull)
      .PutFixed32(7)
      .PutFixed16(9)
      .PutFixed8(3)
      .PutZeros(3)
      .PutFloat(1.5f);
  SpanReader r(fixed);
  EXPECT_EQ(r.GetFixed64("a"), 0x1122334455667788ull);
  EXPECT_EQ(r.GetFixed32("b"), 7u);
  EXPECT_EQ(r.GetFixed16("c"), 9);
  EXPECT_EQ(r.GetFixed8("d"), 3);
  r.Skip(3, "pad");
  EXPECT_EQ(r.GetFloat("e"), 1.5f);
  EXPECT_TRUE(r.Finish("MSG").ok());

  ByteWriter w;
  w.PutString16("name").PutFixed32(5).PutBytes(std::vector<uint8_t>{9, 9});
  const auto bytes = w.Take();
  ASSERT_EQ(bytes.size(), 2u + 4 + 4 + 2);
  SpanReader v(bytes);
  EXPECT_EQ(v.GetString16("name", 16), "name");
  EXPECT_EQ(v.GetFixed32("n"), 5u);
  EXPECT_EQ(v.Rest().size(), 2u);
  EXPECT_TRUE(v.Finish("MSG").ok());
}

TEST(Coding, AppendToWritesAfterWhatABufferHolds) {
  std::vector<uint8_t> out = {9};
  SpanWriter::AppendTo(out, 2 + 3).PutFixed16(3).PutBytes(AsBytes("abc"));
  EXPECT_EQ(out, (std::vector<uint8_t>{9, 3, 0, 'a', 'b', 'c'}));
  SpanWriter w = SpanWriter::AppendTo(out, 4);
  w.PutFixed8(1);
  EXPECT_EQ(w.left(), 3u);
  EXPECT_EQ(out, (std::vector<uint8_t>{9, 3, 0, 'a', 'b', 'c', 1, 0, 0, 0}))
      << "bytes not written are zero";
}

TEST(Coding, ShortLongAndTrailingInputsAreErrorsNamingTheField) {
  const std::vector<uint8_t> five = {1, 2, 3, 4, 5};
  SpanReader r(five);
  EXPECT_EQ(r.GetFixed32("first"), 0x04030201u);
  EXPECT_EQ(r.GetFixed64("version"), 0u);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kProtocolError);
  EXPECT_NE(r.status().message().find("version"), std::string::npos) << r.status();
  EXPECT_EQ(r.GetFixed8("later"), 0) << "a read after an error returns 0";
  EXPECT_NE(r.Finish("MSG").message().find("version"), std::string::npos)
      << "the first error is kept";

  SpanReader t(five);
  (void)t.GetFixed16("x");
  EXPECT_EQ(t.Finish("MSG").code(), StatusCode::kProtocolError);
  EXPECT_NE(t.Finish("MSG").message().find("3 trailing bytes"), std::string::npos);

  ByteWriter w;
  w.PutString16(std::string(40, 'x'));
  const auto long_name = w.Take();
  SpanReader n(long_name);
  EXPECT_EQ(n.GetString16("name", 32), "");
  EXPECT_EQ(n.status().code(), StatusCode::kInvalidArgument);
}

TEST(CodingDeathTest, WritingPastTheBufferAborts) {
  uint8_t b[4];
  EXPECT_DEATH(SpanWriter(b, sizeof b).PutFixed64(1), "wire size");
}

}  // namespace
}  // namespace tessera
