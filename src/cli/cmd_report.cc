#include "cli/command.h"

namespace strata::cli {

void register_report(CLI::App& root, Registry& registry) {
  (void)root;
  (void)registry;
}

}  // namespace strata::cli
