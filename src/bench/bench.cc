// `strata bench ...`: the benchmark family. Each benchmark registers itself under `bench`.
#include "cli/command.h"

namespace strata::cli {

void register_bench(CLI::App& root, Registry& registry) {
  CLI::App* bench = root.add_subcommand("bench", "Measure Strata's components on this machine");
  bench->require_subcommand(1);
  register_bench_io(bench, registry);
  register_bench_adam(bench, registry);
  register_bench_step(bench, registry);
  register_bench_comm(bench, registry);
  register_bench_offload(bench, registry);
}

}  // namespace strata::cli
