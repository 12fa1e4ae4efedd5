// trainer_state.json as hostile input: every field of the wrong type or out of its range, every
// impossible combination of counters, a newer format, a missing checksum — each kCorrupt naming
// the field — and 2,000 seeded structure-aware mutations that never crash. The mutated texts are
// re-sealed (their checksum recomputed) so the checks behind the checksum are reached.
#include <gtest/gtest.h>
#include <json/json.h>

#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"

namespace strata::checkpoint {
namespace {

CheckpointManifest valid() {
  CheckpointManifest m;
  m.counters.step = 5;
  m.counters.adam_step = 4;
  m.counters.skipped_steps = 1;
  m.counters.scheduler_iteration = 3;
  m.counters.tokens_seen = 640;
  m.counters.scaler = {1024.0, 5, 2, 2};
  m.counters.data = {0, 20};
  m.counters.recent_losses = {3.5, 3.25};
  m.seed = 7;
  m.precision = "fp16";
  m.model_json = "{}";
  m.world_size = 2;
  m.zero_stage = 2;
  m.state_files = 2;
  for (int r = 0; r < 2; ++r) {
    StateFileDigest d;
    d.name = state_file_name(r, 2);
    d.bytes = 4096;
    d.header_xxh3 = 0x0123456789abcdefULL + static_cast<std::uint64_t>(r);
    d.tensor_xxh3 = {{"embedding.master", 1}, {"embedding.exp_avg", 2}};
    m.files.push_back(d);
  }
  return m;
}

Json::Value as_json(const std::string& text) {
  Json::Value v;
  Json::CharReaderBuilder b;
  std::string errors;
  std::unique_ptr<Json::CharReader> r(b.newCharReader());
  EXPECT_TRUE(r->parse(text.data(), text.data() + text.size(), &v, &errors)) << errors;
  return v;
}

std::string as_text(const Json::Value& v) {
  Json::StreamWriterBuilder w;
  w["indentation"] = " ";
  return seal_checkpoint_manifest(Json::writeString(w, v));
}

TEST(CheckpointManifest, RoundTrips) {
  const CheckpointManifest m = valid();
  auto back = parse_checkpoint_manifest(render_checkpoint_manifest(m), "t.json");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->counters.step, 5);
  EXPECT_EQ(back->counters.scaler.scale, 1024.0);
  EXPECT_EQ(back->files.size(), 2u);
  EXPECT_EQ(back->files[1].header_xxh3, m.files[1].header_xxh3);
  EXPECT_EQ(back->files[0].tensor_xxh3, m.files[0].tensor_xxh3);
  EXPECT_EQ(back->precision, "fp16");
}

struct Mutation {
  const char* what;                        // the field the error must name
  std::function<void(Json::Value&)> edit;  // applied to a valid manifest
};

TEST(CheckpointManifest, EachBadFieldIsNamed) {
  const std::vector<Mutation> mutations = {
      {"step", [](Json::Value& j) { j["step"] = 1e30; }},
      {"step", [](Json::Value& j) { j["step"] = "5"; }},
      {"step", [](Json::Value& j) { j["step"] = -1; }},
      {"adam_step", [](Json::Value& j) { j["adam_step"] = 0; }},
      {"scheduler_last_batch_iteration",
       [](Json::Value& j) { j["scheduler_last_batch_iteration"] = -100; }},
      {"loss_scaler.scale", [](Json::Value& j) { j["loss_scaler"]["scale"] = 0; }},
      {"loss_scaler.scale", [](Json::Value& j) { j["loss_scaler"]["scale"] = -2.0; }},
      {"loss_scaler", [](Json::Value& j) { j["loss_scaler"] = Json::Value(Json::arrayValue); }},
      {"loss_scaler.iteration", [](Json::Value& j) { j["loss_scaler"]["iteration"] = 9; }},
      {"loss_scaler.hysteresis", [](Json::Value& j) { j["loss_scaler"]["hysteresis"] = 0; }},
      {"loss_scaler.last_overflow_iteration",
       [](Json::Value& j) { j["loss_scaler"]["last_overflow_iteration"] = 99; }},
      {"data", [](Json::Value& j) { j["data"] = 3; }},
      {"data.sample", [](Json::Value& j) { j["data"]["sample"] = -5; }},
      {"recent_losses", [](Json::Value& j) { j["recent_losses"] = "none"; }},
      {"recent_losses", [](Json::Value& j) { j["recent_losses"][0] = "x"; }},
      {"seed", [](Json::Value& j) { j["seed"] = -1; }},
      {"precision", [](Json::Value& j) { j["precision"] = "fp8"; }},
      {"model", [](Json::Value& j) { j["model"] = Json::Value(Json::objectValue); }},
      {"world_size", [](Json::Value& j) { j["world_size"] = 0; }},
      {"state_files", [](Json::Value& j) { j["state_files"] = 1; }},
      {"zero_stage", [](Json::Value& j) { j["zero_stage"] = 4; }},
      {"files", [](Json::Value& j) { j["files"].resize(1); }},
      {"files[1].name", [](Json::Value& j) { j["files"][1]["name"] = "../../etc/passwd"; }},
      {"files[0].bytes", [](Json::Value& j) { j["files"][0]["bytes"] = "big"; }},
      {"files[0].header_xxh3", [](Json::Value& j) { j["files"][0]["header_xxh3"] = "xyz"; }},
      {"files[1].tensors", [](Json::Value& j) { j["files"][1]["tensors"] = 1; }},
      {"files[1].tensors.embedding.master",
       [](Json::Value& j) { j["files"][1]["tensors"]["embedding.master"] = 17; }},
      {"format", [](Json::Value& j) { j["format"] = "strata-checkpoint-9"; }},
      {"format", [](Json::Value& j) { j.removeMember("format"); }},
      {"checksum", [](Json::Value& j) { j.removeMember("checksum"); }},
  };
  for (const Mutation& m : mutations) {
    Json::Value j = as_json(render_checkpoint_manifest(valid()));
    m.edit(j);
    auto r = parse_checkpoint_manifest(as_text(j), "state.json");
    ASSERT_FALSE(r.is_ok()) << m.what;
    EXPECT_EQ(r.status().code(), ErrorCode::kCorrupt) << m.what;
    EXPECT_EQ(r.status().context(), "state.json") << m.what;
    EXPECT_NE(r.status().message().find(m.what), std::string::npos)
        << m.what << ": " << r.status().message();
  }
}

TEST(CheckpointManifest, ANewerFormatSaysSo) {
  Json::Value j = as_json(render_checkpoint_manifest(valid()));
  j["format"] = "strata-checkpoint-4";
  auto r = parse_checkpoint_manifest(as_text(j), "state.json");
  EXPECT_NE(r.status().message().find("a newer Strata wrote it"), std::string::npos)
      << r.status().to_string();
}

// A random JSON value of any type, sometimes nested.
Json::Value random_value(std::mt19937_64& rng, int depth = 0) {
  switch (rng() % (depth < 3 ? 9 : 7)) {
    case 0:
      return Json::Value();
    case 1:
      return Json::Value(static_cast<bool>(rng() % 2));
    case 2:
      return Json::Value(static_cast<Json::Int64>(rng()) >> (rng() % 64));
    case 3:
      return Json::Value(std::ldexp(static_cast<double>(rng() % 2000) - 1000.0,
                                    static_cast<int>(rng() % 200) - 100));
    case 4:
      return Json::Value(-1);
    case 5:
      return Json::Value(std::string(rng() % 3, 'a'));
    case 6:
      return Json::Value(0);
    case 7: {
      Json::Value a(Json::arrayValue);
      a.append(random_value(rng, depth + 1));
      return a;
    }
    default: {
      Json::Value o(Json::objectValue);
      o["k"] = random_value(rng, depth + 1);
      return o;
    }
  }
}

// Every (path to a) member of `v`, objects and arrays alike.
void paths(Json::Value& v, std::vector<Json::Value*>& out) {
  out.push_back(&v);
  if (v.isObject()) {
    for (const std::string& name : v.getMemberNames())
      paths(v[name], out);
  } else if (v.isArray()) {
    for (Json::ArrayIndex i = 0; i < v.size(); ++i)
      paths(v[i], out);
  }
}

TEST(CheckpointManifest, StructureAwareMutationsNeverCrash) {
  const std::uint64_t seed = 20240601;
  std::printf("mutation seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const Json::Value base = as_json(render_checkpoint_manifest(valid()));
  int refused = 0;
  for (int i = 0; i < 2000; ++i) {
    Json::Value j = base;
    std::vector<Json::Value*> all;
    paths(j, all);
    Json::Value* target = all[rng() % all.size()];
    if (target == &j) continue;
    *target = random_value(rng);
    auto r = parse_checkpoint_manifest(as_text(j), "m.json");
    if (!r.is_ok()) {
      ++refused;
      EXPECT_EQ(r.status().code(), ErrorCode::kCorrupt) << i;
      EXPECT_FALSE(r.status().message().empty()) << i;
    }
  }
  EXPECT_GT(refused, 1000);  // nearly every mutation breaks a type, range or invariant
}

}  // namespace
}  // namespace strata::checkpoint
