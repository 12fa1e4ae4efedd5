// NCCL's C API as Strata uses it, loaded at run time with dlopen (libnccl.so.2), so that `strata`
// starts on machines without NCCL. The few NCCL types are declared here with NCCL's ABI (C enums
// are ints, the unique id is 128 bytes passed by value); when nccl.h is available at build time,
// nccl_api.cc checks these declarations against it.
#pragma once

#include <cstddef>
#include <string>

#include "common/status.h"

namespace strata::comm::nccl {

struct UniqueId {
  char internal[128];
};
using CommHandle = struct OpaqueComm*;  // ncclComm_t
using Result = int;                     // ncclResult_t
using DataTypeCode = int;               // ncclDataType_t
using RedOpCode = int;                  // ncclRedOp_t

inline constexpr Result kSuccess = 0;
inline constexpr Result kInProgress = 7;

inline constexpr DataTypeCode kUint8 = 1;
inline constexpr DataTypeCode kInt32 = 2;
inline constexpr DataTypeCode kInt64 = 4;
inline constexpr DataTypeCode kFloat16 = 6;
inline constexpr DataTypeCode kFloat32 = 7;
inline constexpr DataTypeCode kFloat64 = 8;
inline constexpr DataTypeCode kBfloat16 = 9;

inline constexpr RedOpCode kSum = 0;
inline constexpr RedOpCode kMax = 2;

// The entry points; `stream` is a cudaStream_t.
struct Api {
  Result (*get_version)(int* version);
  Result (*get_unique_id)(UniqueId* id);
  Result (*comm_init_rank)(CommHandle* comm, int nranks, UniqueId id, int rank);
  Result (*comm_destroy)(CommHandle comm);
  Result (*comm_abort)(CommHandle comm);
  Result (*comm_get_async_error)(CommHandle comm, Result* async_error);
  const char* (*get_error_string)(Result result);
  Result (*all_gather)(const void* send, void* recv, std::size_t send_count, DataTypeCode type,
                       CommHandle comm, void* stream);
  Result (*reduce_scatter)(const void* send, void* recv, std::size_t recv_count, DataTypeCode type,
                           RedOpCode op, CommHandle comm, void* stream);
  Result (*all_reduce)(const void* send, void* recv, std::size_t count, DataTypeCode type,
                       RedOpCode op, CommHandle comm, void* stream);
  Result (*broadcast)(const void* send, void* recv, std::size_t count, DataTypeCode type, int root,
                      CommHandle comm, void* stream);
  int version = 0;      // NCCL_VERSION_CODE of the loaded library
  std::string library;  // the file that was loaded
};

// Loads libnccl.so.2 once per process and resolves every entry point. Errors (kUnavailable) say
// which library or symbol is missing. The library stays loaded for the life of the process.
strata::Result<const Api*> load_api();

// "ncclUnhandledCudaError: ..." for a result code.
std::string error_text(const Api& api, Result result);

}  // namespace strata::comm::nccl
