// The CUDA backend's fast paths by name (see cuda_fast_paths.h).
#include "backend/cuda_fast_paths.h"

#include "backend/alone_check.h"
#include "backend/apart_check.h"
#include "backend/attention_alone_check.h"
#include "backend/attention_check.h"
#include "backend/gate_up_check.h"
#include "backend/gelu_check.h"
#include "backend/gemm_check.h"
#include "backend/logits_check.h"
#include "backend/norm_check.h"
#include "backend/norm_grad_check.h"
#include "backend/qkv_alone_check.h"
#include "backend/rope_check.h"

namespace strata::backend {

std::vector<FastPath> cuda_fast_paths_unchecked(const std::string& why) {
  const struct {
    const char* name;
    const char* replaces;
  } known[] = {
      {kFlashAttentionName, kFlashAttentionReplaces},
      {kCudnnAttentionName, kCudnnAttentionReplaces},
      {kRopeAttentionName, kRopeAttentionReplaces},
      {kResidualNormName, kResidualNormReplaces},
      {kGemmBiasName, kGemmBiasReplaces},
      {kGemmBiasGeluName, kGemmBiasGeluReplaces},
      {kGemmDgeluName, kGemmDgeluReplaces},
      {kGemmResidualName, kGemmResidualReplaces},
      {kWeights16Name, kWeights16Replaces},
      {kActivations16Name, kActivations16Replaces},
      {kActivations16AloneName, kActivations16AloneReplaces},
      {kAttentionAloneName, kAttentionAloneReplaces},
      {kAttentionGradAloneName, kAttentionGradAloneReplaces},
      {kKeptApartName, kKeptApartReplaces},
      {kLogits16Name, kLogits16Replaces},
      {kGateUp16Name, kGateUp16Replaces},
      {kGelu16Name, kGelu16Replaces},
      {kGeluGradAloneName, kGeluGradAloneReplaces},
      {kGemmBiasGelu16Name, kGemmBiasGelu16Replaces},
      {kGemmDgelu16Name, kGemmDgelu16Replaces},
      {kSwigluGradAloneName, kSwigluGradAloneReplaces},
      {kGateUpGradAloneName, kGateUpGradAloneReplaces},
      {kQkvAloneName, kQkvAloneReplaces},
      {kQkvGradAloneName, kQkvGradAloneReplaces},
      {kNormGradAloneName, kNormGradAloneReplaces},
  };
  std::vector<FastPath> paths;
  for (const auto& k : known)
    paths.push_back(FastPath{k.name, k.replaces, false, why});
  return paths;
}

}  // namespace strata::backend
