// The emulated CUDA runtime (see cuda_runtime_api.h beside this file).
#pragma once

#include "cuda_runtime_api.h"
