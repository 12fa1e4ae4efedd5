// `strata convert CHECKPOINT OUT_DIR [--dtype fp32|bf16|fp16] [--overwrite]`: consolidates the
// fp32 masters of a checkpoint taken at any world size (every rank's shard of every unit) into a
// Hugging Face model directory (config.json + model.safetensors), as DeepSpeed's zero_to_fp32.py
// does. One unit is in memory at a time; every tensor read is checked against the checkpoint's
// digests. An OUT_DIR that exists and is not empty is refused unless --overwrite, and one that
// another Strata process is writing is refused (common/dir_lock.h).
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "checkpoint/reader.h"
#include "checkpoint/root.h"
#include "cli/command.h"
#include "common/dir_lock.h"

namespace strata::cli {
namespace {

struct ConvertOptions {
  std::string checkpoint;
  std::string out_dir;
  std::string dtype = "fp32";
  bool overwrite = false;
};

// Claims OUT_DIR for this conversion: creates it when missing, locks it (a second `strata convert`
// or a run writing there at the same time is refused, naming it), then checks that it is empty
// but for the lock, or that --overwrite allows it.
Result<DirLock> claim_out_dir(const std::string& out_dir, bool overwrite) {
  namespace fs = std::filesystem;
  struct stat st {};
  if (::stat(out_dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      return Status(ErrorCode::kUsage, "exists and is not a directory", out_dir);
    }
  } else if (errno != ENOENT) {
    return Status(ErrorCode::kUsage, fmt::format("cannot use OUT_DIR: {}", std::strerror(errno)),
                  out_dir);
  } else {
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    if (ec) return Status(ErrorCode::kIo, "cannot create: " + ec.message(), out_dir);
  }
  LockRequest request;
  request.dir = out_dir;
  request.context = "OUT_DIR";
  request.busy_code = ErrorCode::kUsage;
  request.advice = "Wait for it to end, or give another OUT_DIR";
  STRATA_ASSIGN_OR_RETURN(DirLock lock, DirLock::acquire(request));
  std::error_code ec;
  bool empty = true;
  for (fs::directory_iterator it(out_dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename() != kDirLockName) empty = false;
  }
  if (ec) return Status(ErrorCode::kIo, "cannot list: " + ec.message(), out_dir);
  if (!empty && !overwrite) {
    return Status(ErrorCode::kUsage,
                  "exists and is not empty; give a new directory, or --overwrite to replace its "
                  "config.json and model.safetensors",
                  out_dir);
  }
  return lock;
}

Result<kernels::DType> dtype_of(const std::string& name) {
  if (name == "fp32") return kernels::DType::kF32;
  if (name == "bf16") return kernels::DType::kBF16;
  if (name == "fp16") return kernels::DType::kF16;
  return Status(ErrorCode::kUsage, "'" + name + "' is not a dtype; valid: fp32, bf16, fp16",
                "--dtype");
}

Status convert(const ConvertOptions& o) {
  STRATA_ASSIGN_OR_RETURN(const kernels::DType dtype, dtype_of(o.dtype));
  STRATA_ASSIGN_OR_RETURN(const std::string dir, checkpoint::find_checkpoint(o.checkpoint));
  STRATA_ASSIGN_OR_RETURN(checkpoint::CheckpointReader reader,
                          checkpoint::CheckpointReader::open(dir));
  STRATA_ASSIGN_OR_RETURN(const model::ModelShape shape, reader.shape());
  STRATA_ASSIGN_OR_RETURN(const checkpoint::TrainerCounters counters, reader.counters());
  STRATA_ASSIGN_OR_RETURN(const DirLock lock, claim_out_dir(o.out_dir, o.overwrite));
  STRATA_TRY(checkpoint::consolidate_checkpoint(reader, o.out_dir, dtype));
  const std::string& source = shape.arch.source_dir;
  std::error_code ec;
  if (!source.empty() && !std::filesystem::is_directory(source, ec)) {
    std::fprintf(stderr,
                 "strata convert: note: the source model directory %s is gone, so its tokenizer "
                 "files and generation_config.json were not copied to %s\n",
                 source.c_str(), o.out_dir.c_str());
  }
  std::printf(
      "converted %s (step %lld, %d rank(s), ZeRO stage %d, %d state file(s), %s): %lld "
      "parameters in %s to %s\n",
      dir.c_str(), static_cast<long long>(counters.step), reader.world_size(), reader.zero_stage(),
      reader.state_files(),
      reader.verified()
          ? "checksums verified"
          : fmt::format("format {}: no checksums to verify", reader.format_version()).c_str(),
      static_cast<long long>(model::total_params(shape)), o.dtype.c_str(), o.out_dir.c_str());
  return Status::ok();
}

}  // namespace

void register_convert(CLI::App& root, Registry& registry) {
  auto o = std::make_shared<ConvertOptions>();
  CLI::App* cmd = root.add_subcommand(
      "convert",
      "Consolidate a checkpoint's master weights (any number of ranks) into a Hugging Face "
      "model directory");
  cmd->add_option("CHECKPOINT", o->checkpoint,
                  "A checkpoint step directory, or a checkpoint root with a 'latest' file")
      ->required();
  cmd->add_option("OUT_DIR", o->out_dir, "Output directory (config.json + model.safetensors)")
      ->required();
  cmd->add_option("--dtype", o->dtype, "Tensor dtype of the output: fp32, bf16 or fp16")
      ->capture_default_str();
  cmd->add_flag("--overwrite", o->overwrite,
                "Write into an OUT_DIR that is not empty (its config.json and model.safetensors "
                "are replaced)");
  registry.add(cmd, [o] {
    const Status s = convert(*o);
    return s.is_ok() ? 0 : report_error(s);
  });
}

}  // namespace strata::cli
