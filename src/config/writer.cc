// The effective configuration as JSON, in schema order, and the lists of key paths.
#include <string>
#include <vector>

#include "config/config.h"
#include "config/render.h"
#include "config/schema.h"

namespace strata::config {
namespace {

// Visitor methods every printing/listing visitor ignores: the keys Strata does not act on.
struct IgnoreUnused {
  void unused(const char*, const Check&, const Unused&) {}
  void refused(const char*, const Check&, const Refuse&) {}
  void alias(const char*, const char*) {}
  void renamed(const char*, const char*) {}
  void legacy(const char*, const char*) {}
  void unknown_keys(UnknownKeys) {}
};

class Writer : public IgnoreUnused {
 public:
  template <typename S>
  void object(S& target) {
    out_ += "{";
    ++depth_;
    first_ = true;
    visit_fields(*this, target);
    --depth_;
    out_ += "\n" + std::string(2 * depth_, ' ') + "}";
    first_ = false;
  }

  void boolean(const char* key, bool& v) { emit(key, render(v)); }
  void integer(const char* key, std::int64_t& v, std::int64_t, std::int64_t) {
    emit(key, render(v));
  }
  void count(const char* key, std::uint64_t& v, std::uint64_t, std::uint64_t, std::uint64_t) {
    emit(key, render(v));
  }
  void bytes(const char* key, std::uint64_t& v) { emit(key, render(v)); }
  void real(const char* key, double& v, double, double, bool) { emit(key, render(v)); }
  void text(const char* key, std::string& v) { emit(key, render(v)); }
  void paths(const char* key, std::vector<std::string>& v) { emit(key, render(v)); }
  void pair(const char* key, std::array<double, 2>& v, double, double) { emit(key, render(v)); }
  void batch(const char* key, std::uint64_t& v, std::uint64_t) { emit(key, render(v)); }
  template <typename E>
  void choice(const char* key, E& v, const EnumNames<E>& names, const Refusals& = {}) {
    emit(key, render_choice(v, names));
  }
  template <typename S>
  void section(const char* key, S& v) {
    start_key(key);
    object(v);
  }
  // Read into Strata's own keys, which are printed where they live.
  template <typename S>
  void mapped_section(const char*, S&) {}

  std::string take() { return std::move(out_); }

 private:
  void start_key(const char* key) {
    out_ += first_ ? "\n" : ",\n";
    first_ = false;
    out_ += std::string(2 * depth_, ' ') + json_quote(key) + ": ";
  }
  void emit(const char* key, const std::string& value) {
    start_key(key);
    out_ += value;
  }

  std::string out_;
  int depth_ = 0;
  bool first_ = true;
};

// Lists key paths. `all` adds the keys Strata does not act on, and the other names.
class KeyLister {
 public:
  explicit KeyLister(bool all) : all_(all) {}
  std::vector<AcceptedKey> keys;

  void boolean(const char* k, bool&) { add(k); }
  void integer(const char* k, std::int64_t&, std::int64_t, std::int64_t) { add(k); }
  void count(const char* k, std::uint64_t&, std::uint64_t, std::uint64_t, std::uint64_t) { add(k); }
  void bytes(const char* k, std::uint64_t&) { add(k); }
  void real(const char* k, double&, double, double, bool) { add(k); }
  void text(const char* k, std::string&) { add(k); }
  void paths(const char* k, std::vector<std::string>&) { add(k); }
  void pair(const char* k, std::array<double, 2>&, double, double) { add(k); }
  void batch(const char* k, std::uint64_t&, std::uint64_t) { add(k); }
  template <typename E>
  void choice(const char* k, E&, const EnumNames<E>&, const Refusals& = {}) {
    add(k);
  }
  template <typename S>
  void section(const char* k, S& v) {
    std::string saved = prefix_;
    prefix_ += std::string(k) + ".";
    visit_fields(*this, v);
    prefix_ = saved;
  }
  template <typename S>
  void mapped_section(const char* k, S& v) {
    if (all_) section(k, v);
  }
  void unused(const char* k, const Check&, const Unused& u) {
    if (all_) keys.push_back({prefix_ + k, KeyUse::kNoEffect, u.why});
  }
  void refused(const char* k, const Check&, const Refuse& r) {
    if (all_) keys.push_back({prefix_ + k, KeyUse::kRefused, r.why});
  }
  void alias(const char* name, const char* key) {
    if (all_) keys.push_back({prefix_ + name, KeyUse::kUsed, "another name of " + prefix_ + key});
  }
  void renamed(const char* old_key, const char* key) {
    if (all_) keys.push_back({prefix_ + old_key, KeyUse::kUsed, "old name of " + prefix_ + key});
  }
  void legacy(const char* old_key, const char* target) {
    if (all_) {
      keys.push_back({prefix_ + old_key, KeyUse::kUsed, std::string("old switch for ") + target});
    }
  }
  void unknown_keys(UnknownKeys) {}

 private:
  void add(const char* k) { keys.push_back({prefix_ + k, KeyUse::kUsed, ""}); }
  bool all_;
  std::string prefix_;
};

// Renders the value of one key path of a config, as the effective configuration shows it.
class PathRenderer : public IgnoreUnused {
 public:
  explicit PathRenderer(std::string path) : path_(std::move(path)) {}
  std::string value;

  void boolean(const char* k, bool& v) { match(k, render(v)); }
  void integer(const char* k, std::int64_t& v, std::int64_t, std::int64_t) { match(k, render(v)); }
  void count(const char* k, std::uint64_t& v, std::uint64_t, std::uint64_t, std::uint64_t) {
    match(k, render(v));
  }
  void bytes(const char* k, std::uint64_t& v) { match(k, render(v)); }
  void real(const char* k, double& v, double, double, bool) { match(k, render(v)); }
  void text(const char* k, std::string& v) { match(k, render(v)); }
  void paths(const char* k, std::vector<std::string>& v) { match(k, render(v)); }
  void pair(const char* k, std::array<double, 2>& v, double, double) { match(k, render(v)); }
  void batch(const char* k, std::uint64_t& v, std::uint64_t) { match(k, render(v)); }
  template <typename E>
  void choice(const char* k, E& v, const EnumNames<E>& names, const Refusals& = {}) {
    match(k, render_choice(v, names));
  }
  template <typename S>
  void section(const char* k, S& v) {
    std::string saved = prefix_;
    prefix_ += std::string(k) + ".";
    visit_fields(*this, v);
    prefix_ = saved;
  }
  template <typename S>
  void mapped_section(const char* k, S& v) {
    section(k, v);
  }

 private:
  void match(const char* k, std::string text) {
    if (prefix_ + k == path_) value = std::move(text);
  }
  std::string path_;
  std::string prefix_;
};

}  // namespace

std::string to_json(const Config& config) {
  Config copy = config;
  Writer writer;
  writer.object(copy);
  return writer.take() + "\n";
}

std::vector<std::string> all_key_paths() {
  Config config;
  KeyLister lister(false);
  visit_fields(lister, config);
  std::vector<std::string> paths;
  for (const AcceptedKey& key : lister.keys)
    paths.push_back(key.path);
  return paths;
}

std::vector<AcceptedKey> accepted_keys() {
  Config config;
  KeyLister lister(true);
  visit_fields(lister, config);
  // Another name of a key does what the key does.
  for (AcceptedKey& key : lister.keys) {
    const std::string prefix = "another name of ";
    if (key.note.rfind(prefix, 0) != 0) continue;
    const std::string target = key.note.substr(prefix.size());
    for (const AcceptedKey& other : lister.keys) {
      if (other.path == target) key.use = other.use;
    }
  }
  return lister.keys;
}

std::string render_path(const Config& config, const std::string& path) {
  Config copy = config;
  PathRenderer renderer(path);
  visit_fields(renderer, copy);
  return renderer.value;
}

}  // namespace strata::config
