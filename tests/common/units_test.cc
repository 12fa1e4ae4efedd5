#include "common/units.h"

#include <gtest/gtest.h>

#include "common/status.h"

namespace strata {
namespace {

TEST(FormatBytes, UsesBinaryUnits) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(4096), "4.00 KiB");
  EXPECT_EQ(format_bytes(3 * kGiB / 2), "1.50 GiB");
  EXPECT_EQ(format_bytes(200 * kMiB), "200 MiB");
}

TEST(ParseBytes, AcceptsIntegersExponentsAndSuffixes) {
  EXPECT_EQ(parse_bytes("4096"), 4096u);
  EXPECT_EQ(parse_bytes("5e8"), 500000000u);
  EXPECT_EQ(parse_bytes("8GiB"), 8 * kGiB);
  EXPECT_EQ(parse_bytes("8 gib"), 8 * kGiB);
  EXPECT_EQ(parse_bytes("1.5G"), 3 * kGiB / 2);
  EXPECT_EQ(parse_bytes("2TB"), 2'000'000'000'000u);
  EXPECT_EQ(parse_bytes("64k"), 64 * kKiB);
}

TEST(ParseCount, AcceptsIntegersExponentsAndDecimalSuffixes) {
  EXPECT_EQ(parse_count("124000000"), 124'000'000u);
  EXPECT_EQ(parse_count("7e9"), 7'000'000'000u);
  EXPECT_EQ(parse_count("7B"), 7'000'000'000u);
  EXPECT_EQ(parse_count("1.5b"), 1'500'000'000u);
  EXPECT_EQ(parse_count("124M"), 124'000'000u);
  EXPECT_EQ(parse_count("3 k"), 3000u);
  EXPECT_EQ(parse_count("2T"), 2'000'000'000'000u);
}

TEST(ParseCount, RejectsFractionsNegativesAndByteSuffixes) {
  EXPECT_FALSE(parse_count(""));
  EXPECT_FALSE(parse_count("-5"));
  EXPECT_FALSE(parse_count("1.5"));
  EXPECT_FALSE(parse_count("7GiB"));
  EXPECT_FALSE(parse_count("seven"));
  EXPECT_FALSE(parse_count("1e30"));
}

TEST(ParseBytes, RejectsNonsense) {
  EXPECT_FALSE(parse_bytes(""));
  EXPECT_FALSE(parse_bytes("-1"));
  EXPECT_FALSE(parse_bytes("GiB"));
  EXPECT_FALSE(parse_bytes("12 apples"));
  EXPECT_FALSE(parse_bytes("0.5"));  // not a whole number of bytes
  EXPECT_FALSE(parse_bytes("1e30"));
}

TEST(Status, CarriesCodeMessageContextAndExitCode) {
  Status ok;
  EXPECT_TRUE(ok.is_ok());
  EXPECT_EQ(ok.exit_code(), 0);
  Status s(ErrorCode::kConfig, "bad value", "cfg.json:3:5");
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.to_string(), "cfg.json:3:5: bad value");
  EXPECT_EQ(s.exit_code(), 2);
  EXPECT_EQ(Status(ErrorCode::kIo, "disk").exit_code(), 1);
  EXPECT_EQ(s.with_context("outer").to_string(), "outer: cfg.json:3:5: bad value");
}

Result<int> half(int x) {
  if (x % 2 != 0) return make_error(ErrorCode::kInvalidArgument, "{} is odd", x);
  return x / 2;
}

Status quarter(int x, int* out) {
  STRATA_ASSIGN_OR_RETURN(int h, half(x));
  STRATA_ASSIGN_OR_RETURN(*out, half(h));
  return Status::ok();
}

TEST(Result, PropagatesErrorsThroughMacros) {
  int out = 0;
  EXPECT_TRUE(quarter(8, &out).is_ok());
  EXPECT_EQ(out, 2);
  Status s = quarter(6, &out);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "3 is odd");
}

}  // namespace
}  // namespace strata
