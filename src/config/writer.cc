// The effective configuration as JSON, in schema order, and the list of every key path.
#include <string>
#include <vector>

#include "config/config.h"
#include "config/render.h"
#include "config/schema.h"

namespace strata::config {
namespace {

class Writer {
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
  void optional_boolean(const char* key, std::optional<bool>& v) {
    emit(key, v ? render(*v) : "null");
  }
  void batch(const char* key, std::uint64_t& v) { emit(key, render(v)); }
  void ignored(const char*) {}
  void renamed(const char*, const char*) {}
  template <typename E>
  void choice(const char* key, E& v, const EnumNames<E>& names) {
    emit(key, render_choice(v, names));
  }
  template <typename S>
  void section(const char* key, S& v) {
    start_key(key);
    object(v);
  }

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

class KeyLister {
 public:
  std::vector<std::string> keys;

  void boolean(const char* k, bool&) { add(k); }
  void integer(const char* k, std::int64_t&, std::int64_t, std::int64_t) { add(k); }
  void count(const char* k, std::uint64_t&, std::uint64_t, std::uint64_t, std::uint64_t) { add(k); }
  void bytes(const char* k, std::uint64_t&) { add(k); }
  void real(const char* k, double&, double, double, bool) { add(k); }
  void text(const char* k, std::string&) { add(k); }
  void paths(const char* k, std::vector<std::string>&) { add(k); }
  void pair(const char* k, std::array<double, 2>&, double, double) { add(k); }
  void optional_boolean(const char* k, std::optional<bool>&) { add(k); }
  void batch(const char* k, std::uint64_t&) { add(k); }
  void ignored(const char*) {}
  void renamed(const char*, const char*) {}
  template <typename E>
  void choice(const char* k, E&, const EnumNames<E>&) {
    add(k);
  }
  template <typename S>
  void section(const char* k, S& v) {
    std::string saved = prefix_;
    prefix_ += std::string(k) + ".";
    visit_fields(*this, v);
    prefix_ = saved;
  }

 private:
  void add(const char* k) { keys.push_back(prefix_ + k); }
  std::string prefix_;
};

}  // namespace

std::string to_json(const Config& config) {
  Config copy = config;
  // Print what is in effect: overlap_comm's default depends on the stage.
  copy.zero_optimization.overlap_comm = config.zero_optimization.effective_overlap_comm();
  Writer writer;
  writer.object(copy);
  return writer.take() + "\n";
}

std::vector<std::string> all_key_paths() {
  Config config;
  KeyLister lister;
  visit_fields(lister, config);
  return lister.keys;
}

}  // namespace strata::config
