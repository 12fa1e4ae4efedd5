// The engine's progress driver (see progress.h).
#include "offload/progress.h"

#include "offload/grad_path.h"
#include "offload/optimizer_pipeline.h"
#include "offload/param_scheduler.h"

namespace strata::offload {

Status Progress::poll() {
  STRATA_TRY(pipeline_.pump());
  STRATA_TRY(grads_.poll());
  return scheduler_.poll();
}

}  // namespace strata::offload
