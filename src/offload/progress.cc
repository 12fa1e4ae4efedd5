// The engine's progress driver (see progress.h).
#include "offload/progress.h"

#include "offload/grad_path.h"
#include "offload/optimizer_pipeline.h"
#include "offload/param_scheduler.h"

namespace strata::offload {

Status Progress::poll() {
  STRATA_TRY(poll_updates());
  STRATA_TRY(grads_.poll());
  return scheduler_.poll();
}

Status Progress::poll_updates() {
  return pipeline_.pump();
}

}  // namespace strata::offload
