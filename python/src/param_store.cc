// strata._core.ParamStore and strata._core.aligned_buffer: the binding of offload::ParamStore
// (offload/param_store.h), an NVMe home for the 16-bit parameters of modules, one opaque byte
// unit per module.
//
//   store = ParamStore(context, unit_bytes)   swap file under zero_optimization.offload_param.
//                                             nvme_path, settings from the context's config as
//                                             the trainer's (aio, strata.nvme_checksum), budget
//                                             strata.nvme_bytes_max shared with the groups
//   store.read(u, out) / store.write(u, src)  block, with the GIL released, until unit u's bytes
//                                             are in `out` / in the swap file
//   aligned_buffer(nbytes)                    a uint8 array on 4096-byte-aligned memory: with
//                                             it (or any array that starts aligned and holds the
//                                             padded unit) the bytes move directly (O_DIRECT),
//                                             any other array through a bounce buffer
//
// read() changes out's first unit_bytes(u) bytes and nothing else; the direct path reads a whole
// padded unit, so it is taken only where the padding lands on memory no array shows (the hidden
// tail of an aligned_buffer whose visible end is the unit's end) or where there is no padding.
// A unit never written cannot be read: StrataError "never written" (offload/param_store.h).
#include <Python.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "binding.h"
#include "common/units.h"
#include "offload/param_store.h"

namespace strata::python {
namespace {

constexpr const char* kAlignedName = "strata.aligned_buffer";
constexpr std::size_t kBufferAlignment = 4096;

// The memory of an aligned_buffer, owned by its capsule: `bytes` shown, `capacity` allocated.
struct AlignedBlock {
  std::uint8_t* data = nullptr;
  std::size_t bytes = 0;
  std::size_t capacity = 0;
};

void free_block(PyObject* capsule) {
  auto* block = static_cast<AlignedBlock*>(PyCapsule_GetPointer(capsule, kAlignedName));
  if (block == nullptr) {
    PyErr_Clear();
    return;
  }
  std::free(block->data);
  delete block;
}

py::array aligned_buffer(std::int64_t nbytes) {
  if (nbytes < 0) {
    check(invalid("nbytes", std::to_string(nbytes) + " bytes; valid: 0 or more"));
  }
  auto block = std::make_unique<AlignedBlock>();
  block->bytes = static_cast<std::size_t>(nbytes);
  block->capacity = align_up(std::max<std::uint64_t>(block->bytes, 1), kBufferAlignment);
  void* raw = nullptr;
  if (::posix_memalign(&raw, kBufferAlignment, block->capacity) != 0) {
    check(Status(ErrorCode::kOutOfMemory,
                 "cannot allocate " + format_bytes(block->capacity) + " aligned to 4096 bytes",
                 "aligned_buffer"));
  }
  block->data = static_cast<std::uint8_t*>(raw);
  std::memset(block->data, 0, block->capacity);
  std::uint8_t* data = block->data;
  py::capsule owner(block.get(), kAlignedName, &free_block);
  block.release();  // the capsule owns it now
  return py::array(py::dtype::of<std::uint8_t>(), {nbytes}, {1}, data, owner);
}

// The array's bytes. Through numpy's attributes, not pybind11's itemsize(), which reads the dtype
// struct at the offsets of numpy 1 (numpy 2 moved its elsize).
std::uint64_t nbytes(const py::array& array) {
  return array.attr("nbytes").cast<std::uint64_t>();
}

// The aligned_buffer block behind `array` (through views of it), or nullptr.
const AlignedBlock* block_of(const py::array& array) {
  py::object base = array.attr("base");
  while (py::isinstance<py::array>(base)) {
    py::object next = base.attr("base");
    if (next.is_none()) return nullptr;
    base = next;
  }
  if (!PyCapsule_CheckExact(base.ptr()) || !PyCapsule_IsValid(base.ptr(), kAlignedName)) {
    return nullptr;
  }
  const auto* block =
      static_cast<const AlignedBlock*>(PyCapsule_GetPointer(base.ptr(), kAlignedName));
  const auto* data = static_cast<const std::uint8_t*>(array.data());
  if (data < block->data || data + nbytes(array) > block->data + block->bytes) return nullptr;
  return block;
}

// `arg` as an ndarray of raw bytes the store may move: C-contiguous, not of objects, and (for
// `out`) writable; the errors name the argument and what is valid.
py::array byte_array(const py::object& arg, const char* name, bool writable) {
  if (!py::isinstance<py::array>(arg)) {
    check(invalid(name, "a " + std::string(py::str(arg.get_type().attr("__name__"))) +
                            " is not a numpy array; valid: a C-contiguous numpy array (any "
                            "dtype), e.g. from aligned_buffer(nbytes) or tensor.numpy()"));
  }
  py::array array = py::reinterpret_borrow<py::array>(arg);
  if (!array.attr("flags").attr("c_contiguous").cast<bool>()) {
    check(invalid(name,
                  "the array is not C-contiguous; valid: a C-contiguous array "
                  "(numpy.ascontiguousarray)"));
  }
  if (array.attr("dtype").attr("hasobject").cast<bool>()) {
    check(invalid(name,
                  "an array of Python objects has no raw bytes to move; valid: a numeric "
                  "dtype"));
  }
  if (writable && !array.attr("flags").attr("writeable").cast<bool>()) {
    check(invalid(name, "the array is read-only; valid: a writable array"));
  }
  return array;
}

class ParamStore {
 public:
  ParamStore(Context& context, const std::vector<std::int64_t>& unit_bytes) : context_(&context) {
    const char* key = offload::ParamStore::kPathKey;
    // The swap settings as the trainer makes them (train/run_settings: aio, checksums).
    const offload::SwapSettings swap = train::plan_settings(context.config()).swap;
    if (swap.param_dirs.empty()) {
      check(Status(ErrorCode::kConfig,
                   "ParamStore keeps the parameters in swap files under this folder and the "
                   "config gives none; valid: a path or a list of 1 to 8 paths of folders on the "
                   "NVMe drive(s), e.g. \"nvme_path\": \"/local_nvme\"",
                   key));
    }
    std::vector<std::uint64_t> bytes;
    for (std::size_t u = 0; u < unit_bytes.size(); ++u) {
      if (unit_bytes[u] <= 0) {
        check(invalid("unit_bytes", "unit " + std::to_string(u) + " has " +
                                        std::to_string(unit_bytes[u]) +
                                        " bytes; valid: 1 or more"));
      }
      bytes.push_back(static_cast<std::uint64_t>(unit_bytes[u]));
    }
    // The folders pass the checks `strata train` makes (created 0700, never one that every user
    // may write to without the sticky bit), whatever offload_param.device says.
    check(train::prepare_nvme_folders(swap.param_dirs, key));
    offload::ParamStoreSettings s;
    s.dirs = swap.param_dirs;
    s.checksum = swap.checksum;
    s.engine = swap.engine;
    s.bytes_max = context.nvme_left();  // strata.nvme_bytes_max, less what groups took
    s.swap_tag = context.next_param_tag();
    Result<std::unique_ptr<offload::ParamStore>> made = Status(ErrorCode::kInternal, "not made");
    {
      py::gil_scoped_release release;
      made = offload::ParamStore::create(s, bytes);
    }
    store_ = take(std::move(made));
    nvme_ = store_->nvme_bytes();
    context.add_nvme(nvme_);
  }
  ~ParamStore() {
    if (store_ == nullptr) return;
    give_back_budget();
    store_.reset();  // closes it, logging a failure
  }
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  int units() const { return open().units(); }
  std::uint64_t unit_bytes(std::int64_t u) const { return open().unit_bytes(checked(u)); }

  void read(std::int64_t u, const py::object& out) {
    offload::ParamStore& store = open();
    const int unit = checked(u);
    py::array array = byte_array(out, "out", true);
    const std::uint64_t need = store.unit_bytes(unit);
    too_small(array, need, unit, "out");
    auto* data = static_cast<std::uint8_t*>(array.mutable_data());
    // Bytes the store may write: the unit's, and the hidden tail of an aligned_buffer when the
    // unit ends where the buffer's visible bytes do.
    std::uint64_t room = need;
    if (const AlignedBlock* block = block_of(array);
        block != nullptr && data + need == block->data + block->bytes) {
      room = static_cast<std::uint64_t>(block->data + block->capacity - data);
    }
    Status status;
    {
      py::gil_scoped_release release;
      status = store.read(unit, data, room);
    }
    check(status);
  }

  void write(std::int64_t u, const py::object& src) {
    offload::ParamStore& store = open();
    const int unit = checked(u);
    py::array array = byte_array(src, "src", false);
    const std::uint64_t need = store.unit_bytes(unit);
    too_small(array, need, unit, "src");
    const void* data = array.data();
    // Bytes the store may read: the array's, and all of an aligned_buffer's memory after it.
    std::uint64_t room = static_cast<std::uint64_t>(nbytes(array));
    if (const AlignedBlock* block = block_of(array); block != nullptr) {
      room = static_cast<std::uint64_t>(block->data + block->capacity -
                                        static_cast<const std::uint8_t*>(data));
    }
    Status status;
    {
      py::gil_scoped_release release;
      status = store.write(unit, data, room);
    }
    check(status);
  }

  py::dict usage() const {
    const offload::ParamStoreUsage use = open().usage();
    py::dict d;
    d["nvme_bytes"] = use.nvme_bytes;
    d["read_bytes"] = use.read_bytes;
    d["write_bytes"] = use.write_bytes;
    d["reads"] = use.reads;
    d["writes"] = use.writes;
    d["dirs"] = use.dirs;
    d["checksums"] = use.checksums;
    d["io_read_bytes"] = use.io_read_bytes;
    d["io_write_bytes"] = use.io_write_bytes;
    d["bounce_buffers"] = use.bounce_buffers;
    d["alignment"] = open().alignment();
    return d;
  }

  void close() {
    if (store_ == nullptr || store_->closed()) return;
    give_back_budget();
    Status status;
    {
      py::gil_scoped_release release;
      status = store_->close();
    }
    check(status);
  }

 private:
  offload::ParamStore& open() const {
    if (store_ == nullptr || store_->closed()) {
      check(Status(ErrorCode::kInvalidArgument,
                   "the parameter store is closed (its swap files are removed); make a new "
                   "ParamStore",
                   "ParamStore"));
    }
    return *store_;
  }
  int checked(std::int64_t u) const {
    const int units = store_->units();
    if (u < 0 || u >= units) {
      check(invalid(
          "u", std::to_string(u) + " is not a unit; valid: 0 to " + std::to_string(units - 1)));
    }
    return static_cast<int>(u);
  }
  static void too_small(const py::array& array, std::uint64_t need, int u, const char* name) {
    if (static_cast<std::uint64_t>(nbytes(array)) < need) {
      check(invalid(name, "the array has " + std::to_string(nbytes(array)) + " bytes but unit " +
                              std::to_string(u) + " has " + std::to_string(need) +
                              "; valid: at least " + std::to_string(need) + " bytes"));
    }
  }
  void give_back_budget() {
    context_->release_nvme(nvme_);
    nvme_ = 0;
  }

  Context* context_;  // kept alive by the binding (keep_alive)
  std::unique_ptr<offload::ParamStore> store_;
  std::uint64_t nvme_ = 0;  // what this store took of strata.nvme_bytes_max
};

}  // namespace

void bind_param_store(py::module_& m) {
  py::class_<ParamStore>(m, "ParamStore",
                         "Opaque byte units (a module's 16-bit parameters each) in a swap file "
                         "under zero_optimization.offload_param.nvme_path")
      .def(py::init<Context&, const std::vector<std::int64_t>&>(), py::arg("context"),
           py::arg("unit_bytes"), py::keep_alive<1, 2>())
      .def("units", &ParamStore::units)
      .def("unit_bytes", &ParamStore::unit_bytes, py::arg("u"))
      .def("read", &ParamStore::read, py::arg("u"), py::arg("out"),
           "Unit u's bytes into out (a C-contiguous writable numpy array of at least "
           "unit_bytes(u) bytes); blocks with the GIL released")
      .def("write", &ParamStore::write, py::arg("u"), py::arg("src"),
           "src's first unit_bytes(u) bytes to unit u's place in the swap file; blocks with the "
           "GIL released until the write has completed")
      .def("usage", &ParamStore::usage)
      .def("close", &ParamStore::close, "Removes the swap files; later calls raise StrataError");
  m.def("aligned_buffer", &aligned_buffer, py::arg("nbytes"),
        "A uint8 numpy array of nbytes on memory aligned to 4096 bytes (freed with the array)");
}

}  // namespace strata::python
