// `strata report`: what this machine and this build offer Strata (see sys/report.h).
#include <fmt/format.h>
#include <json/writer.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda_fast_paths.h"
#include "backend/fast_path.h"
#include "cli/command.h"
#include "io/probe.h"
#include "sys/report.h"

namespace strata::cli {
namespace {

// The CUDA backend's fast paths (backend/fast_path.h), as a bf16 run would get them: a CUDA
// backend on GPU 0 with bf16 GEMMs and a small arena runs their start-up checks. Without a GPU
// (or a CUDA build) each known fast path is listed off, with why.
std::vector<backend::FastPath> check_fast_paths() {
  std::string why;
  if (backend::cuda_backend_built()) {
    backend::CudaBackendOptions options;
    options.device_bytes_max = 1ull << 30;
    options.host_bytes_max = 64ull << 20;
    options.cpu_threads = 1;
    options.gemm_precision = cuda::GemmPrecision::kBf16;
    Result<std::unique_ptr<backend::Backend>> created = backend::make_cuda_backend(options);
    if (created.is_ok()) return (*created)->fast_paths();
    why = fmt::format("not checked: no CUDA backend here ({})", created.status().to_string());
  } else {
    why = "not checked: this build has no CUDA backend";
  }
  return backend::cuda_fast_paths_unchecked(why);
}

struct ReportOptions {
  std::string path;
  bool json = false;
};

int run_report(const ReportOptions& options) {
  // The I/O facts are probed here, above both io/ and sys/, and handed to the machine report.
  std::optional<sys::DirectoryProbe> directory;
  if (!options.path.empty()) {
    Result<sys::DirectoryProbe> probe = io::probe_directory(options.path);
    if (!probe.is_ok()) {
      const Status& why = probe.status();
      // A directory that is missing or is not a directory is a wrong argument (exit 2); one that
      // exists but cannot be written or probed is a runtime failure (exit 1).
      const bool usage =
          why.code() == ErrorCode::kNotFound || why.code() == ErrorCode::kInvalidArgument;
      return report_error(usage
                              ? Status(ErrorCode::kUsage, why.message(), "--path " + why.context())
                              : why.with_context("--path"));
    }
    directory = std::move(probe).value();
  }
  const sys::MachineReport report = sys::collect_report(io::probe_io_uring(), std::move(directory));
  const std::vector<backend::FastPath> fast_paths = check_fast_paths();
  if (options.json) {
    Json::StreamWriterBuilder writer;
    writer["indentation"] = "  ";
    Json::Value root = sys::report_json(report);
    root["fast_paths"] = backend::fast_paths_json(fast_paths);
    std::string text = Json::writeString(writer, root);
    std::printf("%s\n", text.c_str());
  } else {
    std::fputs(sys::report_text(report).c_str(), stdout);
    std::printf("Fast paths of the CUDA backend (bf16 GEMMs, checked at its start):\n%s",
                backend::fast_paths_text(fast_paths).c_str());
  }
  return 0;
}

}  // namespace

void register_report(CLI::App& root, Registry& registry) {
  auto options = std::make_shared<ReportOptions>();
  CLI::App* report = root.add_subcommand(
      "report",
      "Describe this machine and build: SIMD, cores and NUMA, memory and ulimit -l, GPUs, CUDA, "
      "NCCL, io_uring, the CUDA backend's fast paths, and with --path whether O_DIRECT works in "
      "a directory");
  report->add_option("--path", options->path,
                     "Directory to probe for the NVMe tier: file system, O_DIRECT, alignment, "
                     "free space");
  report->add_flag("--json", options->json, "Print one JSON object instead of text");
  registry.add(report, [options] { return run_report(*options); });
}

}  // namespace strata::cli
