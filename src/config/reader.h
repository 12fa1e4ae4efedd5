// The schema visitor that fills a Config from a JSON tree: converts and range-checks each value,
// notes "auto", maps aliases and old key names, classifies the DeepSpeed keys Strata does not act
// on (no effect, or refused), and reports unknown keys with the nearest valid one. Problems are
// collected (not stopped at) so one run shows every mistake in a file, and every key given is
// recorded for the migration report.
#pragma once

#include <fmt/format.h>
#include <json/json.h>

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "config/config.h"
#include "config/json_source.h"
#include "config/render.h"
#include "config/schema.h"

namespace strata::config {

// Where the reader puts what it finds.
struct ReaderOutput {
  std::vector<std::string> errors;
  std::vector<Note> notes;
  std::vector<KeyReport> keys;
  std::vector<std::ptrdiff_t> key_offsets;  // per keys[i]: its offset in the file (sort key)
  std::set<std::string> autos;              // key paths whose value was "auto"
  std::set<std::string> invalid;            // key paths with an error (cross-key checks skip them)
};

// At most this many unknown keys of one section are listed one by one (with a suggestion each);
// the rest are counted in one line, so a hostile file of 200k keys costs linear time.
inline constexpr std::size_t kUnknownKeysListedMax = 20;

class Reader {
 public:
  Reader(const JsonSource& source, ReaderOutput* out) : source_(source), out_(out) {}

  // Reads the object `node` at key path `path` into `target`.
  template <typename S>
  void read_object(const Json::Value& node, const std::string& path, S& target) {
    Json::Value object = node;
    frames_.emplace_back(&object, path);
    apply_renames(object, path, target);
    visit_fields(*this, target);
    report_unknown_keys();
    frames_.pop_back();
  }

  // ---- the visitor interface (see config/schema.h) ----
  void boolean(const char* key, bool& out);
  void integer(const char* key, std::int64_t& out, std::int64_t lo, std::int64_t hi);
  void count(const char* key, std::uint64_t& out, std::uint64_t lo, std::uint64_t hi,
             std::uint64_t multiple);
  void bytes(const char* key, std::uint64_t& out);
  void real(const char* key, double& out, double lo, double hi, bool lo_open);
  void text(const char* key, std::string& out);
  void paths(const char* key, std::vector<std::string>& out);
  void pair(const char* key, std::array<double, 2>& out, double lo, double hi);
  void batch(const char* key, std::uint64_t& out, std::uint64_t hi);
  void unused(const char* key, const Check& check, const Unused& unused);
  void refused(const char* key, const Check& check, const Refuse& refuse);
  void alias(const char* name, const char* key);
  void renamed(const char* old_key, const char* new_key);
  void legacy(const char* old_key, const char* target);
  void unknown_keys(UnknownKeys policy) { frames_.back().unknown = policy; }

  template <typename E>
  void choice(const char* key, E& out, const EnumNames<E>& names, const Refusals& refused = {}) {
    const Json::Value* value = take(key);
    if (value == nullptr) return;
    std::string valid;
    for (const auto& [v, name] : names)
      valid += (valid.empty() ? "" : ", ") + std::string(name);
    if (value->isString()) {
      const std::string given = value->asString();
      for (const auto& [v, name] : names) {
        if (equals_ignore_case(given, name)) {
          out = v;
          used(*value, key, "");
          return;
        }
      }
      if (given == "auto") {
        is_auto(*value, key);
        return;
      }
      for (const auto& [name, why] : refused) {
        if (equals_ignore_case(given, name)) {
          refuse(*value, key,
                 fmt::format("'{}' is not supported: {}; valid values: {}", given, why, valid));
          frames_.back().refused_type = true;
          return;
        }
      }
      fail(*value, key, "'" + given + "' is not valid; valid values: " + valid);
      // A type Strata does not know (a "type" choice, the one with refusals): its parameters
      // are not read either.
      if (!refused.empty()) frames_.back().refused_type = true;
      return;
    }
    fail(*value, key, "expected one of " + valid + ", got " + describe(*value));
  }

  template <typename S>
  void section(const char* key, S& out) {
    const Json::Value* value = take(key);
    if (value == nullptr || value->isNull()) return;
    if (frames_.back().refused_type) {
      // The section's type was refused (an optimizer Strata does not have): its parameters
      // belong to that type, so they are not read.
      record(*value, child_path(key), KeyUse::kRefused, "parameters of a refused type");
      return;
    }
    if (!value->isObject()) {
      fail(*value, key, "expected a section (a JSON object {...}), got " + describe(*value));
      return;
    }
    read_object(*value, child_path(key), out);
  }

  template <typename S>
  void mapped_section(const char* key, S& out) {
    section(key, out);
  }

 private:
  struct Frame {
    Frame(Json::Value* object_in, std::string path_in)
        : object(object_in), path(std::move(path_in)) {}
    Json::Value* object;
    std::string path;
    UnknownKeys unknown = UnknownKeys::kError;
    bool refused_type = false;                  // a choice of this section was refused
    std::unordered_set<std::string> known;      // every key accepted here
    std::vector<std::string> accepted;          // the same, in schema order, for messages
    std::vector<std::string> used;              // the keys Strata acts on (suggestions)
    std::map<std::string, std::string> origin;  // key -> the alias/old name it was given as
  };

  // Collects a section's alias/renamed/legacy declarations so other names can be mapped first.
  struct RenameCollector;

  template <typename S>
  void apply_renames(Json::Value& object, const std::string& path, S& target);

  // Marks `key` as accepted here and returns its value, or nullptr when absent. `acts` is false
  // for keys Strata accepts but does not act on.
  const Json::Value* take(const char* key, bool acts = true);
  std::string child_path(const char* key) const;
  // The path the user wrote for `key` (an alias or old name when the value came under one).
  std::string given_path(const char* key) const;
  bool is_auto(const Json::Value& value, const char* key);
  void used(const Json::Value& value, const char* key, const std::string& detail);
  void record(const Json::Value& value, const std::string& path, KeyUse use,
              const std::string& detail);
  void fail(const Json::Value& value, const char* key, const std::string& message);
  void refuse(const Json::Value& value, const char* key, const std::string& message);
  // Checks `value` as `check` says; on failure reports it and returns false.
  bool check_value(const Json::Value& value, const char* key, const Check& check);
  void report_unknown_keys();
  static std::string describe(const Json::Value& value);
  static bool equals_ignore_case(const std::string& a, std::string_view b);
  // Reads a whole number from an integer or an integral real (DeepSpeed configs write 5e8).
  static bool whole_number(const Json::Value& value, long double* out);

  const JsonSource& source_;
  ReaderOutput* out_;
  std::vector<Frame> frames_;
};

struct Reader::RenameCollector {
  struct Rename {
    std::string from;
    std::string to;
    bool is_alias;
  };
  std::vector<Rename> renames;
  void alias(const char* name, const char* key) { renames.push_back({name, key, true}); }
  void renamed(const char* old_key, const char* key) { renames.push_back({old_key, key, false}); }
  template <typename... A>
  void legacy(A&&...) {}
  template <typename... A>
  void unknown_keys(A&&...) {}
  template <typename... A>
  void boolean(A&&...) {}
  template <typename... A>
  void integer(A&&...) {}
  template <typename... A>
  void count(A&&...) {}
  template <typename... A>
  void bytes(A&&...) {}
  template <typename... A>
  void real(A&&...) {}
  template <typename... A>
  void text(A&&...) {}
  template <typename... A>
  void paths(A&&...) {}
  template <typename... A>
  void pair(A&&...) {}
  template <typename... A>
  void batch(A&&...) {}
  void unused(const char*, const Check&, const Unused&) {}
  void refused(const char*, const Check&, const Refuse&) {}
  template <typename... A>
  void choice(A&&...) {}
  template <typename... A>
  void section(A&&...) {}
  template <typename... A>
  void mapped_section(A&&...) {}
};

template <typename S>
void Reader::apply_renames(Json::Value& object, const std::string& path, S& target) {
  RenameCollector collector;
  visit_fields(collector, target);
  Frame& frame = frames_.back();
  for (const auto& rename : collector.renames) {
    frame.known.insert(rename.from);
    frame.accepted.push_back(rename.from);
    if (!object.isMember(rename.from)) continue;
    const std::string from_path = path.empty() ? rename.from : path + "." + rename.from;
    const std::string to_path = path.empty() ? rename.to : path + "." + rename.to;
    if (object.isMember(rename.to)) {
      if (object[rename.to] != object[rename.from]) {
        out_->errors.push_back(source_.locate(object[rename.from], from_path) + ": " + from_path +
                               ": " + (rename.is_alias ? "another name" : "the old name") +
                               " of '" + to_path +
                               "', which is also set, differently; keep only '" + rename.to + "'");
        out_->invalid.insert(to_path);
        record(object[rename.from], from_path, KeyUse::kInvalid, "conflicts with " + rename.to);
      } else {
        record(object[rename.from], from_path, KeyUse::kUsed, "same value as " + rename.to);
      }
      object.removeMember(rename.from);
      continue;
    }
    if (!rename.is_alias) {
      out_->notes.push_back({from_path, "old name of '" + to_path + "'; read as " + rename.to});
    }
    object[rename.to] = object[rename.from];
    object.removeMember(rename.from);
    frame.origin[rename.to] = rename.from;
  }
}

}  // namespace strata::config
