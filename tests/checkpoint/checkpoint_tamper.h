// Helpers that change a written checkpoint as a damaged disk, a careless user or an attacker
// would, for the integrity tests: flip a byte, and rewrite the manifest so that it describes the
// files as they now are (its digests recomputed), to reach the checks behind the digests.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "checkpoint/manifest.h"
#include "model/safetensors.h"
#include "tests/support/run_strata.h"

namespace strata::testing {

// XORs the byte at `offset` of `path` with `mask`.
inline void flip_byte(const std::string& path, std::uint64_t offset, std::uint8_t mask = 0x01) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ static_cast<char>(mask));
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
  ASSERT_TRUE(f.good()) << path;
}

// The parsed manifest of the checkpoint `dir`.
inline checkpoint::CheckpointManifest read_manifest(const std::string& dir) {
  auto m = checkpoint::parse_checkpoint_manifest(read_file(dir + "/trainer_state.json"), dir);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m.is_ok() ? *m : checkpoint::CheckpointManifest{};
}

// Writes `m` as `dir`'s manifest, its digests recomputed from the state files as they are.
inline void rewrite_manifest(const std::string& dir, checkpoint::CheckpointManifest m) {
  for (checkpoint::StateFileDigest& d : m.files) {
    auto file = model::SafetensorsFile::open(dir + "/" + d.name);
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    d.bytes = file->file_bytes();
    d.header_xxh3 = file->header_xxh3();
    d.tensor_xxh3.clear();
    for (const model::StTensor& t : file->tensors())
      d.tensor_xxh3[t.name] = file->tensor_xxh3(t);
  }
  std::ofstream(dir + "/trainer_state.json", std::ios::binary | std::ios::trunc)
      << checkpoint::render_checkpoint_manifest(m);
}

}  // namespace strata::testing
