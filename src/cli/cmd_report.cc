// `strata report`: what this machine and this build offer Strata (see sys/report.h).
#include <json/writer.h>

#include <cstdio>
#include <optional>
#include <utility>

#include "cli/command.h"
#include "io/probe.h"
#include "sys/report.h"

namespace strata::cli {
namespace {

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
  if (options.json) {
    Json::StreamWriterBuilder writer;
    writer["indentation"] = "  ";
    std::string text = Json::writeString(writer, sys::report_json(report));
    std::printf("%s\n", text.c_str());
  } else {
    std::fputs(sys::report_text(report).c_str(), stdout);
  }
  return 0;
}

}  // namespace

void register_report(CLI::App& root, Registry& registry) {
  auto options = std::make_shared<ReportOptions>();
  CLI::App* report = root.add_subcommand(
      "report",
      "Describe this machine and build: SIMD, cores and NUMA, memory and ulimit -l, GPUs, CUDA, "
      "NCCL, io_uring, and with --path whether O_DIRECT works in a directory");
  report->add_option("--path", options->path,
                     "Directory to probe for the NVMe tier: file system, O_DIRECT, alignment, "
                     "free space");
  report->add_flag("--json", options->json, "Print one JSON object instead of text");
  registry.add(report, [options] { return run_report(*options); });
}

}  // namespace strata::cli
