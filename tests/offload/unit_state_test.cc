// A unit's optimizer state as fp32 (offload/unit_state.h), the one path OffloadStore::view / store
// and the Python binding's load_state / store_state share: what is written is read back as the
// plan's codec gives it, in every home and every stored format.
#include "offload/unit_state.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "offload/slot_codec.h"
#include "offload_fixture.h"

namespace strata::offload {
namespace {

using testing::FlatTiers;

// fp32 state, or the compressed formats (bf16 master and gradient, 8-bit moments).
StateFormat format_of(bool compressed) {
  StateFormat f;
  if (compressed) {
    f.master = kernels::DType::kBF16;
    f.moments = kernels::MomentFormat::kQ8;
    f.grad = kernels::DType::kBF16;
  }
  return f;
}

// What the codec makes of `values`: encoded as the plan stores `kind`, then decoded.
std::vector<float> through_codec(const TierPlan& plan, SlotKind kind, int unit,
                                 const std::vector<float>& values) {
  std::vector<std::uint8_t> stored(plan.shard_bytes(kind, unit));
  std::vector<float> out(values.size());
  encode_slot(plan, kind, unit, values.data(), stored.data());
  decode_slot(plan, kind, unit, stored.data(), out.data());
  return out;
}

TEST(UnitState, WhatIsWrittenIsReadBackAsTheCodecGivesItInEveryHomeAndFormat) {
  for (Tier home : {Tier::kHost, Tier::kNvme}) {
    for (bool compressed : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << "home " << to_string(home) << ", compressed " << compressed);
      FlatTiers f;
      PlanSettings settings =
          testing::flat_settings(kernels::DType::kBF16, Tier::kHost, home, f.dir.path());
      settings.state = format_of(compressed);
      ASSERT_TRUE(f.build({5000, 3000}, settings).is_ok());
      for (int u = 0; u < 2; ++u) {
        const std::int64_t n = f.plan().units[static_cast<std::size_t>(u)].shard_numel;
        for (SlotKind kind :
             {SlotKind::kMaster, SlotKind::kExpAvg, SlotKind::kExpAvgSq, SlotKind::kGrad}) {
          std::vector<float> values(static_cast<std::size_t>(n));
          for (std::int64_t i = 0; i < n; ++i)
            values[static_cast<std::size_t>(i)] = testing::known_value(u, kind, i);
          ASSERT_TRUE(write_unit_state(*f.tiers, kind, u, values.data()).is_ok());
          Result<const float*> read = read_unit_state(*f.tiers, kind, u);
          ASSERT_TRUE(read.is_ok()) << read.status().to_string();
          const std::vector<float> expected = through_codec(f.plan(), kind, u, values);
          EXPECT_EQ(std::memcmp(*read, expected.data(), expected.size() * 4), 0)
              << to_string(kind) << " of unit " << u;
        }
      }
    }
  }
}

}  // namespace
}  // namespace strata::offload
