// The namespace of the CUDA backend's code (kernels/cuda, src/backend/cuda): strata::<ns>. The
// build that runs that same code on the CPU (STRATA_CUDA_EMULATED: the SIMT emulator's launches and
// the stand-in runtime of tests/support/emulated_cuda) puts it in an inline namespace `emulated`
// inside, so that the emulated copy links beside the real one in one program while the code still
// names strata::cuda::GemmEngine, strata::cuda_kernels::add and so on.
#pragma once

#if defined(STRATA_CUDA_EMULATED)
#define STRATA_CUDA_NAMESPACE(ns) namespace strata::ns::inline emulated
#else
#define STRATA_CUDA_NAMESPACE(ns) namespace strata::ns
#endif
