// `strata bench io`: sequential NVMe read/write throughput and latency through Strata's I/O
// engine, the NVMe -> pinned buffer copy path, and (--sweep/--tune) the best `aio` settings.
#include <json/json.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "bench/bench.h"
#include "bench/io_passes.h"
#include "common/units.h"
#include "io/probe.h"

namespace strata::bench {
namespace {

struct IoOptions {
  std::string path;
  std::string file;
  std::string file_size = "1GiB";
  std::string pass_size;
  std::string mode = "both";
  std::string block_size = "1MiB";
  std::uint32_t queue_depth = 8;
  std::uint32_t threads = 1;
  std::uint32_t repeat = 1;
  std::string engine = "auto";
  std::string memory_max = "1GiB";
  bool json = false;
  bool no_copy = false;
  bool sweep = false;
  bool tune = false;
  std::string tune_output;
  std::vector<std::string> sweep_block_sizes;
  std::vector<std::uint32_t> sweep_queue_depths;
  std::vector<std::uint32_t> sweep_threads;
};

Result<std::uint64_t> bytes_option(const std::string& name, const std::string& text) {
  std::optional<std::uint64_t> value = parse_bytes(text);
  if (!value.has_value() || *value == 0) {
    return Status(
        ErrorCode::kUsage,
        fmt::format("{} '{}' is not a positive byte count (e.g. 1MiB, 8M, 4096)", name, text));
  }
  return *value;
}

// A progress bar on stderr, drawn only when stderr is a terminal.
void draw_progress(const char* pass, double fraction) {
  constexpr int kWidth = 40;
  const int filled = static_cast<int>(fraction * kWidth);
  std::fprintf(stderr, "\r%-6s [%s%s] %3d%%", pass, std::string(filled, '#').c_str(),
               std::string(kWidth - filled, ' ').c_str(), static_cast<int>(fraction * 100));
  if (fraction >= 1.0) std::fprintf(stderr, "\r%*s\r", kWidth + 16, "");
  std::fflush(stderr);
}

Json::Value latency_json(const LatencyPercentiles& l) {
  Json::Value v;
  v["p50"] = l.p50_us;
  v["p90"] = l.p90_us;
  v["p99"] = l.p99_us;
  v["p99_9"] = l.p999_us;
  v["max"] = l.max_us;
  return v;
}

Json::Value result_json(const IoBenchConfig& c, const IoBenchResult& r) {
  Json::Value v;
  v["engine"] = r.engine;
  v["direct"] = r.direct;
  v["registered_buffers"] = r.registered_buffers;
  v["alignment"] = r.alignment_bytes;
  v["block_size"] = Json::UInt64(c.engine.block_size_bytes);
  v["queue_depth"] = c.engine.queue_depth;
  v["threads"] = c.engine.threads;
  v["file_size"] = Json::UInt64(c.file_size_bytes);
  v["repeat"] = c.repeat;
  v["read_gbps"] = r.read.ran ? Json::Value(r.read.gbps) : Json::Value();
  v["write_gbps"] = r.write.ran ? Json::Value(r.write.gbps) : Json::Value();
  v["copy_gbps"] = r.copy.ran ? Json::Value(r.copy.gbps) : Json::Value();
  if (r.read.ran) v["read_latency_us"] = latency_json(r.read.latency);
  if (r.write.ran) v["write_latency_us"] = latency_json(r.write.latency);
  if (r.copy.ran) v["copy_latency_us"] = latency_json(r.copy.latency);
  return v;
}

std::string to_text(const Json::Value& v) {
  Json::StreamWriterBuilder builder;
  builder["indentation"] = "  ";
  return Json::writeString(builder, v) + "\n";
}

void print_result(const IoBenchConfig& c, const IoBenchResult& r) {
  std::printf("file %s (%s), engine %s, %s, alignment %u, %s buffers\n", c.file.c_str(),
              format_bytes(c.file_size_bytes).c_str(), r.engine.c_str(),
              r.direct ? "O_DIRECT" : "buffered (page cache!)", r.alignment_bytes,
              r.registered_buffers ? "registered" : "unregistered");
  std::printf("block %s, queue depth %u, threads %u\n\n",
              format_bytes(c.engine.block_size_bytes).c_str(), c.engine.queue_depth,
              c.engine.threads);
  std::printf("%-6s %8s %10s %10s %10s %10s %10s\n", "pass", "GB/s", "p50 us", "p90 us", "p99 us",
              "p99.9 us", "max us");
  auto row = [](const char* name, const PassResult& p) {
    if (!p.ran) return;
    std::printf("%-6s %8.3f %10.0f %10.0f %10.0f %10.0f %10.0f\n", name, p.gbps, p.latency.p50_us,
                p.latency.p90_us, p.latency.p99_us, p.latency.p999_us, p.latency.max_us);
  };
  row("write", r.write);
  row("read", r.read);
  row("copy", r.copy);
  if (r.copy.ran) {
    std::printf(
        "\ncopy = NVMe -> pinned staging buffer -> destination buffer (the trainer's "
        "path)\n");
  }
}

int run_sweep(const IoOptions& o, const IoBenchConfig& base) {
  SweepGrid grid;
  if (!o.sweep_block_sizes.empty()) {
    grid.block_sizes_bytes.clear();
    for (const std::string& text : o.sweep_block_sizes) {
      auto b = bytes_option("--sweep-block-sizes", text);
      if (!b.is_ok()) return cli::report_error(b.status());
      grid.block_sizes_bytes.push_back(*b);
    }
  }
  if (!o.sweep_queue_depths.empty()) grid.queue_depths = o.sweep_queue_depths;
  if (!o.sweep_threads.empty()) grid.threads = o.sweep_threads;
  auto points = run_io_sweep(base, grid);
  if (!points.is_ok()) return cli::report_error(points.status());
  const SweepPoint* best = best_point(*points);
  if (o.json) {
    Json::Value v;
    v["sweep"] = Json::Value(Json::arrayValue);
    for (const SweepPoint& p : *points) {
      IoBenchConfig c = base;
      c.engine.block_size_bytes = p.block_size_bytes;
      c.engine.queue_depth = p.queue_depth;
      c.engine.threads = p.threads;
      Json::Value e = p.skipped ? Json::Value() : result_json(c, p.result);
      e["block_size"] = Json::UInt64(p.block_size_bytes);
      e["queue_depth"] = p.queue_depth;
      e["threads"] = p.threads;
      if (p.skipped) e["skipped"] = p.skip_reason;
      v["sweep"].append(e);
    }
    if (best != nullptr) {
      v["best"]["block_size"] = Json::UInt64(best->block_size_bytes);
      v["best"]["queue_depth"] = best->queue_depth;
      v["best"]["threads"] = best->threads;
    }
    std::fputs(to_text(v).c_str(), stdout);
  } else {
    std::printf("%10s %6s %7s %10s %10s %12s %12s\n", "block", "qd", "threads", "read GB/s",
                "write GB/s", "read p99 us", "write p99 us");
    for (const SweepPoint& p : *points) {
      std::printf("%10s %6u %7u ", format_bytes(p.block_size_bytes).c_str(), p.queue_depth,
                  p.threads);
      if (p.skipped) {
        std::printf("skipped: %s\n", p.skip_reason.c_str());
        continue;
      }
      const IoBenchResult& r = p.result;
      std::printf("%10.3f %10.3f %12.0f %12.0f\n", r.read.ran ? r.read.gbps : 0.0,
                  r.write.ran ? r.write.gbps : 0.0, r.read.latency.p99_us, r.write.latency.p99_us);
    }
    if (best != nullptr) {
      std::printf("\nbest: block %s, queue depth %u, threads %u\n",
                  format_bytes(best->block_size_bytes).c_str(), best->queue_depth, best->threads);
    }
  }
  if (o.tune) {
    if (best == nullptr) {
      return cli::report_error(
          Status(ErrorCode::kUnavailable, "no sweep point ran; nothing to tune"));
    }
    const std::string section = aio_section_json(*best);
    if (o.tune_output.empty()) {
      std::fputs(section.c_str(), o.json ? stderr : stdout);
    } else {
      std::ofstream out(o.tune_output);
      out << section;
      if (!out) {
        return cli::report_error(
            Status(ErrorCode::kIo, "cannot write the aio section", o.tune_output));
      }
      std::fprintf(stderr, "strata: wrote the tuned aio section to %s\n", o.tune_output.c_str());
    }
  }
  return 0;
}

int run_io(const IoOptions& o) {
  if (o.path.empty() == o.file.empty()) {
    return cli::report_error(
        Status(ErrorCode::kUsage, "give exactly one of --path DIR or --file FILE"));
  }
  IoBenchConfig c;
  if (!o.path.empty()) {
    auto probe = io::probe_directory(o.path);
    if (!probe.is_ok()) return cli::report_error(probe.status());
    c.file = fmt::format("{}/strata-bench-io-{}.dat", o.path, ::getpid());
  } else {
    c.file = o.file;
    c.keep_file = true;
  }
  auto file_size = bytes_option("--file-size", o.file_size);
  auto block = bytes_option("--block-size", o.block_size);
  auto memory = bytes_option("--memory-max", o.memory_max);
  for (const auto* r : {&file_size, &block, &memory}) {
    if (!r->is_ok()) return cli::report_error(r->status());
  }
  c.file_size_bytes = *file_size;
  c.memory_max_bytes = *memory;
  if (!o.pass_size.empty()) {
    auto pass = bytes_option("--pass-size", o.pass_size);
    if (!pass.is_ok()) return cli::report_error(pass.status());
    c.pass_bytes = *pass;
  }
  c.read = o.mode != "write";
  c.write = o.mode != "read";
  c.copy_path = !o.no_copy && c.read;
  auto kind = io::parse_engine_kind(o.engine);
  if (!kind.has_value() || *kind == io::EngineKind::kSim) {
    return cli::report_error(Status(
        ErrorCode::kUsage, fmt::format("--engine '{}' must be auto, uring or posix", o.engine)));
  }
  c.engine.kind = *kind;
  c.engine.block_size_bytes = *block;
  c.engine.queue_depth = o.queue_depth;
  c.engine.threads = o.threads;
  c.repeat = o.repeat;
  if (::isatty(STDERR_FILENO)) c.progress = draw_progress;

  if (o.sweep || o.tune) return run_sweep(o, c);
  auto result = run_io_bench(c);
  if (!result.is_ok()) return cli::report_error(result.status());
  if (o.json) {
    Json::Value v = result_json(c, *result);
    v["file"] = c.file;
    std::fputs(to_text(v).c_str(), stdout);
  } else {
    print_result(c, *result);
  }
  return 0;
}

}  // namespace

void register_io(CLI::App* bench, cli::Registry& registry) {
  auto o = std::make_shared<IoOptions>();
  CLI::App* io = bench->add_subcommand(
      "io",
      "NVMe throughput: sequential read/write GB/s and latency percentiles through Strata's "
      "I/O engine (O_DIRECT), plus the NVMe -> pinned buffer copy path; --sweep/--tune find "
      "the best aio settings");
  io->add_option("--path", o->path,
                 "Directory to benchmark in (a temporary file is made and removed)");
  io->add_option("--file", o->file, "Benchmark this file instead (made if missing; kept)");
  io->add_option("--file-size", o->file_size, "Size of the benchmark file")->capture_default_str();
  io->add_option("--pass-size", o->pass_size, "Bytes per pass (default: the whole file)");
  io->add_option("--mode", o->mode, "Passes to run")
      ->check(CLI::IsMember({"read", "write", "both"}))
      ->capture_default_str();
  io->add_option("--block-size", o->block_size, "Bytes per request (aio.block_size)")
      ->capture_default_str();
  io->add_option("--queue-depth", o->queue_depth, "Requests in flight per thread")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  io->add_option("--threads", o->threads, "I/O threads (aio.intra_op_parallelism)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  io->add_option("--repeat", o->repeat,
                 "Passes of each kind (per sweep point too); the median GB/s is reported")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  io->add_option("--engine", o->engine, "auto, uring or posix")->capture_default_str();
  io->add_option("--memory-max", o->memory_max,
                 "Most staging memory (block x queue depth x threads) a run may use")
      ->capture_default_str();
  io->add_flag("--json", o->json, "Print one JSON object");
  io->add_flag("--no-copy-path", o->no_copy, "Skip the NVMe -> pinned buffer copy pass");
  io->add_flag("--sweep", o->sweep,
               "Run a grid of block sizes, queue depths and threads and print a table");
  io->add_flag("--tune", o->tune, "Sweep, then print the best settings as an aio config section");
  io->add_option("--tune-output", o->tune_output, "Write the tuned aio section to this file");
  io->add_option("--sweep-block-sizes", o->sweep_block_sizes,
                 "Block sizes for --sweep (default 128KiB 256KiB 1MiB 4MiB 16MiB)");
  io->add_option("--sweep-queue-depths", o->sweep_queue_depths,
                 "Queue depths for --sweep (default 1 4 8 32 128)");
  io->add_option("--sweep-threads", o->sweep_threads, "Threads for --sweep (default 1 2 4 8)");
  registry.add(io, [o] { return run_io(*o); });
}

}  // namespace strata::bench
