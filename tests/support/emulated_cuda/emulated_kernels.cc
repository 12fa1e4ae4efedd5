// The CUDA backend's kernel launchers (kernels/cuda/*.cu), their own source, with the SIMT emulator
// as the launcher: each launch is entered in the launch log by the kernel function's name and
// queued on its stream, which runs it on the CPU, one block at a time.
#pragma GCC diagnostic ignored "-Wunused-function"
#include "support/simt_emulator.h"
// The kernel headers after the emulator (they pick up its built-ins).
#include "kernels/cuda/adam_kernels.cuh"
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/elementwise_kernels.cuh"
#include "kernels/cuda/flash_attention_f32.cuh"
#include "kernels/cuda/gemm_fallback_kernels.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/loss_kernels.cuh"
#include "kernels/cuda/norm_kernels.cuh"
//
#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "tests/support/emulated_cuda/emulated_cuda.h"

namespace strata::testing::emulated_cuda {
namespace {

struct Log {
  std::mutex mutex;
  std::vector<std::string> kernels;
  std::vector<const void*> streams;          // each launch's stream
  std::map<const void*, std::string> names;  // kernel address -> name, as found
};

Log& launches() {
  static Log l;
  return l;
}

// The test program's function symbols (its ELF symbol table, local ones included: the kernels have
// internal linkage), by run-time address.
const std::map<std::uintptr_t, std::string>& function_symbols() {
  static const std::map<std::uintptr_t, std::string> symbols = [] {
    std::map<std::uintptr_t, std::string> found;
    std::ifstream in("/proc/self/exe", std::ios::binary);
    const std::vector<char> image((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
    if (image.size() < sizeof(Elf64_Ehdr)) return found;
    Elf64_Ehdr header;
    std::memcpy(&header, image.data(), sizeof(header));
    if (std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 ||
        header.e_ident[EI_CLASS] != ELFCLASS64 ||
        header.e_shoff + std::uint64_t{header.e_shnum} * sizeof(Elf64_Shdr) > image.size()) {
      return found;
    }
    std::vector<Elf64_Shdr> sections(header.e_shnum);
    std::memcpy(sections.data(), image.data() + header.e_shoff,
                sections.size() * sizeof(Elf64_Shdr));
    // The load address: where this very function is, less its address in the file.
    Dl_info self{};
    if (dladdr(reinterpret_cast<const void*>(&function_symbols), &self) == 0) return found;
    const auto base = reinterpret_cast<std::uintptr_t>(self.dli_fbase);
    for (const Elf64_Shdr& table : sections) {
      if (table.sh_type != SHT_SYMTAB || table.sh_link >= sections.size()) continue;
      const Elf64_Shdr& strings = sections[table.sh_link];
      if (table.sh_offset + table.sh_size > image.size() ||
          strings.sh_offset + strings.sh_size > image.size()) {
        continue;
      }
      for (std::uint64_t off = 0; off + sizeof(Elf64_Sym) <= table.sh_size;
           off += sizeof(Elf64_Sym)) {
        Elf64_Sym sym;
        std::memcpy(&sym, image.data() + table.sh_offset + off, sizeof(sym));
        if (ELF64_ST_TYPE(sym.st_info) != STT_FUNC || sym.st_value == 0 ||
            sym.st_name >= strings.sh_size) {
          continue;
        }
        const char* name = image.data() + strings.sh_offset + sym.st_name;
        found.emplace(base + sym.st_value,
                      std::string(name, ::strnlen(name, strings.sh_size - sym.st_name)));
      }
    }
    return found;
  }();
  return symbols;
}

// "strata::cuda_kernels::emulated::(anonymous namespace)::cast_block_kernel(unsigned short*, ...)"
// -> "cast_block_kernel"; template arguments dropped.
std::string name_of(const void* kernel) {
  const auto& symbols = function_symbols();
  const auto it = symbols.find(reinterpret_cast<std::uintptr_t>(kernel));
  if (it == symbols.end()) return "unknown_kernel";
  int status = 0;
  char* demangled = abi::__cxa_demangle(it->second.c_str(), nullptr, nullptr, &status);
  std::string full = status == 0 && demangled != nullptr ? demangled : it->second;
  std::free(demangled);
  // Cut the parameter list (the first '(' outside template brackets and not "(anonymous"), then
  // template arguments, the namespaces and any return type.
  std::string name;
  int depth = 0;
  for (std::size_t i = 0; i < full.size(); ++i) {
    const char c = full[i];
    if (c == '<') {
      ++depth;
    } else if (c == '>') {
      --depth;
    } else if (depth == 0) {
      if (c == '(' && full.compare(i, 11, "(anonymous ") != 0) break;
      name += c;
    }
  }
  const std::size_t colon = name.rfind("::");
  if (colon != std::string::npos) name = name.substr(colon + 2);
  const std::size_t space = name.rfind(' ');
  if (space != std::string::npos) name = name.substr(space + 1);
  return name;
}

}  // namespace

void record_launch(const void* kernel, const void* stream) {
  Log& l = launches();
  std::lock_guard<std::mutex> lock(l.mutex);
  auto it = l.names.find(kernel);
  if (it == l.names.end()) it = l.names.emplace(kernel, name_of(kernel)).first;
  l.kernels.push_back(it->second);
  l.streams.push_back(stream);
}

std::vector<std::string> launch_log() {
  std::lock_guard<std::mutex> lock(launches().mutex);
  return launches().kernels;
}

std::vector<std::string> compute_stream_log() {
  Log& l = launches();
  std::lock_guard<std::mutex> lock(l.mutex);
  std::set<const void*> gemm_streams;
  for (std::size_t i = 0; i < l.kernels.size(); ++i) {
    if (kernel_family(l.kernels[i]) == "gemm") gemm_streams.insert(l.streams[i]);
  }
  std::vector<std::string> out;
  for (std::size_t i = 0; i < l.kernels.size(); ++i) {
    if (gemm_streams.count(l.streams[i]) != 0) out.push_back(l.kernels[i]);
  }
  return out;
}

void clear_launch_log() {
  std::lock_guard<std::mutex> lock(launches().mutex);
  launches().kernels.clear();
  launches().streams.clear();
}

}  // namespace strata::testing::emulated_cuda

STRATA_CUDA_NAMESPACE(cuda_kernels) {

// The launcher the .cu files below call CudaLauncher: the launch is logged and queued on its
// stream; the SIMT emulator runs it, behind one lock (it has one machine), when the stream runs.
struct CudaLauncher {
  cudaStream_t stream;
  template <typename Kernel, typename... Args>
  cudaError_t operator()(Kernel kernel, dim3 grid, dim3 block, std::size_t smem,
                         Args... args) const {
    testing::emulated_cuda::record_launch(reinterpret_cast<const void*>(kernel), stream);
    testing::emulated_cuda::enqueue(stream, [=] {
      static std::mutex one_machine;
      std::lock_guard<std::mutex> lock(one_machine);
      return ::simt::Launcher{}(kernel, grid, block, smem, args...) == 0;
    });
    return cudaSuccess;
  }
};

}  // STRATA_CUDA_NAMESPACE(cuda_kernels)

// The launchers themselves, exactly as nvcc builds them.
#include "kernels/cuda/adam.cu"
#include "kernels/cuda/attention.cu"
#include "kernels/cuda/elementwise.cu"
#include "kernels/cuda/flash_attention.cu"
#include "kernels/cuda/gemm_fallback.cu"
#include "kernels/cuda/loss.cu"
#include "kernels/cuda/norm.cu"
