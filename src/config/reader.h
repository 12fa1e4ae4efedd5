// The schema visitor that fills a Config from a JSON tree: converts and range-checks each value,
// resolves "auto", maps old key names, and reports unknown keys with the nearest valid one.
// Problems are collected (not stopped at) so one run shows every mistake in a file.
#pragma once

#include <json/json.h>

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/json_source.h"
#include "config/render.h"
#include "config/schema.h"

namespace strata::config {

class Reader {
 public:
  Reader(const JsonSource& source, std::vector<std::string>* errors, std::vector<Note>* notes)
      : source_(source), errors_(errors), notes_(notes) {}

  // Reads the object `node` at key path `path` into `target`.
  template <typename S>
  void read_object(const Json::Value& node, const std::string& path, S& target) {
    Json::Value object = node;
    apply_renames(object, path, target);
    frames_.push_back(Frame{&object, path, {}, {}});
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
  void optional_boolean(const char* key, std::optional<bool>& out);
  void batch(const char* key, std::uint64_t& out);
  void ignored(const char* key);
  void renamed(const char* old_key, const char* new_key);

  template <typename E>
  void choice(const char* key, E& out, const EnumNames<E>& names) {
    const Json::Value* value = take(key);
    if (value == nullptr || is_auto(*value, key, render_choice(out, names))) return;
    std::string valid;
    for (const auto& [v, name] : names)
      valid += (valid.empty() ? "" : ", ") + std::string(name);
    if (!value->isString()) {
      fail(*value, key, "expected one of " + valid + ", got " + describe(*value));
      return;
    }
    std::string given = value->asString();
    for (const auto& [v, name] : names) {
      if (equals_ignore_case(given, name)) {
        out = v;
        return;
      }
    }
    fail(*value, key, "'" + given + "' is not valid; valid values: " + valid);
  }

  template <typename S>
  void section(const char* key, S& out) {
    const Json::Value* value = take(key);
    if (value == nullptr || value->isNull()) return;
    if (!value->isObject()) {
      fail(*value, key, "expected a section (a JSON object {...}), got " + describe(*value));
      return;
    }
    read_object(*value, child_path(key), out);
  }

 private:
  struct Frame {
    Json::Value* object;
    std::string path;
    std::set<std::string> known;    // every key the schema accepts here
    std::vector<std::string> used;  // the keys Strata uses, in schema order, for messages
  };

  // Collects renamed() declarations of a section so the old names can be mapped first.
  struct RenameCollector;

  template <typename S>
  void apply_renames(Json::Value& object, const std::string& path, S& target);

  // Marks `key` as accepted here and returns its value, or nullptr when absent. `used` is false
  // for DeepSpeed keys Strata accepts but ignores.
  const Json::Value* take(const char* key, bool used = true);
  std::string child_path(const char* key) const;
  bool is_auto(const Json::Value& value, const char* key, const std::string& resolved);
  void fail(const Json::Value& value, const char* key, const std::string& message);
  void report_unknown_keys();
  static std::string describe(const Json::Value& value);
  static bool equals_ignore_case(const std::string& a, std::string_view b);
  // Reads a whole number from an integer or an integral real (DeepSpeed configs write 5e8).
  static bool whole_number(const Json::Value& value, long double* out);

  const JsonSource& source_;
  std::vector<std::string>* errors_;
  std::vector<Note>* notes_;
  std::vector<Frame> frames_;
};

struct Reader::RenameCollector {
  std::vector<std::pair<std::string, std::string>> renames;
  void renamed(const char* old_key, const char* new_key) { renames.emplace_back(old_key, new_key); }
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
  void optional_boolean(A&&...) {}
  template <typename... A>
  void batch(A&&...) {}
  template <typename... A>
  void ignored(A&&...) {}
  template <typename... A>
  void choice(A&&...) {}
  template <typename... A>
  void section(A&&...) {}
};

template <typename S>
void Reader::apply_renames(Json::Value& object, const std::string& path, S& target) {
  RenameCollector collector;
  visit_fields(collector, target);
  for (const auto& [old_key, new_key] : collector.renames) {
    if (!object.isMember(old_key)) continue;
    std::string old_path = path.empty() ? old_key : path + "." + old_key;
    std::string new_path = path.empty() ? new_key : path + "." + new_key;
    if (object.isMember(new_key) && object[new_key] != object[old_key]) {
      errors_->push_back(source_.locate(object[old_key], old_path) + ": " + old_path +
                         ": the old name of '" + new_path + "', which is also set, differently; " +
                         "keep only '" + new_key + "'");
      continue;
    }
    notes_->push_back({old_path, "old name of '" + new_path + "'; read as " + new_key});
    object[new_key] = object[old_key];
    object.removeMember(old_key);
  }
}

}  // namespace strata::config
