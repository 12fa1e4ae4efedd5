// cuDNN's fused attention graphs (see cudnn_sdpa.h).
#include "kernels/cuda/cudnn_sdpa.h"

#include <fmt/format.h>

#include <array>
#include <limits>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

STRATA_CUDA_NAMESPACE(cuda) {
namespace {

// The handle attributes of the operation graph and the execution plan are deprecated in newer
// headers but still read by every cuDNN 9 this accepts.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
constexpr cudnnBackendAttributeName_t kGraphHandle = CUDNN_ATTR_OPERATIONGRAPH_HANDLE;
constexpr cudnnBackendAttributeName_t kPlanHandle = CUDNN_ATTR_EXECUTION_PLAN_HANDLE;
#pragma GCC diagnostic pop

using Dims = std::array<std::int64_t, 4>;

// The uids of the tensors a call passes (non-virtual); by-value scalars and virtual tensors follow.
enum Uid : std::int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSoftmaxSum,
  kFirstScalar = 32,
  kFirstVirtual = 64,
};

// One owned backend descriptor.
class Descriptor {
 public:
  Descriptor() = default;
  Descriptor(const CudnnApi* api, cudnnBackendDescriptor_t d) : api_(api), d_(d) {}
  Descriptor(Descriptor&& o) noexcept : api_(o.api_), d_(std::exchange(o.d_, nullptr)) {}
  Descriptor& operator=(Descriptor&& o) noexcept {
    if (this != &o) {
      reset();
      api_ = o.api_;
      d_ = std::exchange(o.d_, nullptr);
    }
    return *this;
  }
  ~Descriptor() { reset(); }
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  void reset() {
    if (d_ != nullptr) api_->destroy_descriptor(d_);
    d_ = nullptr;
  }
  const CudnnApi* api_ = nullptr;
  cudnnBackendDescriptor_t d_ = nullptr;
};

struct Tensor {
  cudnnBackendDescriptor_t d = nullptr;
  std::int64_t uid = 0;
  Dims dims{};
  Dims strides{};
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
};

Dims packed_strides(const Dims& dims) {
  return {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
}

// Builds one graph's tensors and operation nodes, finalizing each; the first failure is kept with
// the node it happened in, and every later call does nothing.
class Builder {
 public:
  Builder(const CudnnApi& api, const SdpaSpec& spec) : api_(api), spec_(spec) {
    io_ = spec.bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    negative_infinity_ = api.version < 91000 ? std::numeric_limits<float>::lowest()
                                             : -std::numeric_limits<float>::infinity();
  }

  const Status& status() const { return status_; }
  const std::vector<cudnnBackendDescriptor_t>& operations() const { return operations_; }
  const std::vector<std::pair<std::int64_t, float>>& scalars() const { return scalars_; }
  std::vector<Descriptor> take_owned() { return std::move(owned_); }
  cudnnDataType_t io() const { return io_; }

  // A tensor the call passes (uid fixed) or a virtual one (uid drawn).
  Tensor tensor(std::int64_t uid, const Dims& dims, const Dims& strides, cudnnDataType_t type,
                bool is_virtual = false) {
    node_ = fmt::format("tensor {}", uid);
    return describe_tensor(uid, dims, strides, type, CUDNN_ATTR_TENSOR_IS_VIRTUAL, is_virtual);
  }
  Tensor virtual_tensor(const Dims& dims, const Dims& strides, cudnnDataType_t type) {
    return tensor(next_virtual_++, dims, strides, type, true);
  }
  // A host scalar passed by value (fp32, 1x1x1x1); the call's variant pack carries its value.
  Tensor scalar(float value) {
    const std::int64_t uid = kFirstScalar + static_cast<std::int64_t>(scalars_.size());
    node_ = fmt::format("scalar {}", value);
    const Tensor t = describe_tensor(uid, {1, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_FLOAT,
                                     CUDNN_ATTR_TENSOR_IS_BY_VALUE, true);
    scalars_.emplace_back(uid, value);
    return t;
  }

  // y = mode(x[, b][, t]); y is `out` when given, else a virtual tensor of x's shape in `type`.
  Tensor pointwise(const char* name, cudnnPointwiseMode_t mode, const Tensor& x,
                   const Tensor* b = nullptr, const Tensor* t = nullptr,
                   cudnnDataType_t type = CUDNN_DATA_FLOAT,
                   cudnnDataType_t compute = CUDNN_DATA_FLOAT, std::int64_t axis = -1,
                   const Tensor* out = nullptr) {
    const Tensor y = out != nullptr ? *out : virtual_tensor(x.dims, x.strides, type);
    node_ = name;
    cudnnBackendDescriptor_t pw = computing(
        CUDNN_BACKEND_POINTWISE_DESCRIPTOR, CUDNN_ATTR_POINTWISE_MATH_PREC,
        [&](auto d) {
          set(d, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
          if (axis >= 0) {
            set(d, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
          }
        },
        compute);
    std::vector<std::pair<cudnnBackendAttributeName_t, cudnnBackendDescriptor_t>> attributes = {
        {CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw},
        {CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x.d}};
    if (b != nullptr) attributes.emplace_back(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b->d);
    if (t != nullptr) attributes.emplace_back(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t->d);
    attributes.emplace_back(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y.d);
    operation(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, attributes);
    return y;
  }
  Tensor binary(const char* name, cudnnPointwiseMode_t mode, const Tensor& x, const Tensor& b,
                cudnnDataType_t type = CUDNN_DATA_FLOAT, cudnnDataType_t compute = CUDNN_DATA_FLOAT,
                const Tensor* out = nullptr) {
    return pointwise(name, mode, x, &b, nullptr, type, compute, -1, out);
  }

  // c = a·b over the last two dimensions (batched over the first two, b's heads broadcast).
  Tensor matmul(const char* name, const Tensor& a, const Tensor& b, const Dims& dims,
                const Dims& strides, cudnnDataType_t type, const Tensor* out = nullptr) {
    const Tensor c = out != nullptr ? *out : virtual_tensor(dims, strides, type);
    node_ = name;
    cudnnBackendDescriptor_t mm =
        computing(CUDNN_BACKEND_MATMUL_DESCRIPTOR, CUDNN_ATTR_MATMUL_COMP_TYPE, nullptr);
    operation(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, {{CUDNN_ATTR_OPERATION_MATMUL_ADESC, a.d},
                                                          {CUDNN_ATTR_OPERATION_MATMUL_BDESC, b.d},
                                                          {CUDNN_ATTR_OPERATION_MATMUL_CDESC, c.d},
                                                          {CUDNN_ATTR_OPERATION_MATMUL_DESC, mm}});
    return c;
  }

  // y = reduce(x) to `dims` (row statistics, or grouped heads summed).
  Tensor reduction(const char* name, cudnnReduceTensorOp_t mode, const Tensor& x, const Dims& dims,
                   const Dims& strides, cudnnDataType_t type, const Tensor* out = nullptr) {
    const Tensor y = out != nullptr ? *out : virtual_tensor(dims, strides, type);
    node_ = name;
    cudnnBackendDescriptor_t red =
        computing(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, CUDNN_ATTR_REDUCTION_COMP_TYPE, [&](auto d) {
          set(d, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
        });
    operation(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR,
              {{CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x.d},
               {CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y.d},
               {CUDNN_ATTR_OPERATION_REDUCTION_DESC, red}});
    return y;
  }

  // The same elements seen with other dimensions and strides (a transpose), in `type`.
  Tensor reshape(const char* name, const Tensor& x, const Dims& dims, const Dims& strides,
                 cudnnDataType_t type) {
    const Tensor y = virtual_tensor(dims, strides, type);
    node_ = name;
    operation(
        CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR,
        {{CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x.d}, {CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y.d}});
    return y;
  }

  // Scores outside the causal band (key after the query) and, with a window W, keys W or more
  // before the query, set to -inf: index comparisons selecting between the scores and -inf, the
  // pattern cuDNN's fused attention recognizes (one index pair per band).
  Tensor mask(const Tensor& s) {
    const Tensor minus_inf = scalar(negative_infinity_);
    const Tensor row = pointwise("row index", CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr,
                                 CUDNN_DATA_INT32, CUDNN_DATA_FLOAT, 2);
    const Tensor col = pointwise("column index", CUDNN_POINTWISE_GEN_INDEX, s, nullptr, nullptr,
                                 CUDNN_DATA_INT32, CUDNN_DATA_FLOAT, 3);
    const Tensor causal = binary("row >= column", CUDNN_POINTWISE_CMP_GE, row, col,
                                 CUDNN_DATA_BOOLEAN, CUDNN_DATA_BOOLEAN);
    Tensor masked =
        pointwise("causal select", CUDNN_POINTWISE_BINARY_SELECT, s, &minus_inf, &causal);
    if (spec_.window <= 0) return masked;
    const Tensor window = scalar(static_cast<float>(spec_.window));
    const Tensor row2 = pointwise("window row index", CUDNN_POINTWISE_GEN_INDEX, masked, nullptr,
                                  nullptr, CUDNN_DATA_INT32, CUDNN_DATA_FLOAT, 2);
    const Tensor col2 = pointwise("window column index", CUDNN_POINTWISE_GEN_INDEX, masked, nullptr,
                                  nullptr, CUDNN_DATA_INT32, CUDNN_DATA_FLOAT, 3);
    const Tensor shifted = binary("column + window", CUDNN_POINTWISE_ADD, col2, window);
    const Tensor inside = binary("column + window > row", CUDNN_POINTWISE_CMP_GT, shifted, row2,
                                 CUDNN_DATA_BOOLEAN, CUDNN_DATA_BOOLEAN);
    return pointwise("window select", CUDNN_POINTWISE_BINARY_SELECT, masked, &minus_inf, &inside);
  }

  cudnnBackendDescriptor_t create(cudnnBackendDescriptorType_t type) {
    if (!status_.is_ok()) return nullptr;
    cudnnBackendDescriptor_t d = nullptr;
    const cudnnStatus_t st = api_.create_descriptor(type, &d);
    if (st != CUDNN_STATUS_SUCCESS) {
      fail("cudnnBackendCreateDescriptor", st);
      return nullptr;
    }
    owned_.emplace_back(&api_, d);
    return d;
  }
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
           cudnnBackendAttributeType_t type, std::int64_t count, const void* value) {
    if (!status_.is_ok()) return;
    const cudnnStatus_t st = api_.set_attribute(d, name, type, count, value);
    if (st != CUDNN_STATUS_SUCCESS) {
      fail(fmt::format("cudnnBackendSetAttribute(attribute {})", static_cast<int>(name)), st);
    }
  }
  void finalize(cudnnBackendDescriptor_t d) {
    if (!status_.is_ok()) return;
    const cudnnStatus_t st = api_.finalize(d);
    if (st != CUDNN_STATUS_SUCCESS) fail("cudnnBackendFinalize", st);
  }
  void fail(const std::string& call, cudnnStatus_t st) {
    status_ =
        Status(ErrorCode::kUnavailable,
               fmt::format("cuDNN refused the {} attention graph's node \"{}\": {}: {}",
                           backward_ ? "backward" : "forward", node_, call, api_.describe(st)),
               "cuDNN");
  }
  void set_backward(bool backward) { backward_ = backward; }

 private:
  // A finalized tensor descriptor: type, dimensions, strides, uid, 16-byte alignment, and `flag`
  // (virtual, or by value) set to `value`.
  Tensor describe_tensor(std::int64_t uid, const Dims& dims, const Dims& strides,
                         cudnnDataType_t type, cudnnBackendAttributeName_t flag, bool value) {
    Tensor t;
    t.uid = uid;
    t.dims = dims;
    t.strides = strides;
    t.type = type;
    t.d = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const std::int64_t alignment = 16;
    set(t.d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    set(t.d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    set(t.d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    set(t.d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(t.d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    set(t.d, flag, CUDNN_TYPE_BOOLEAN, 1, &value);
    finalize(t.d);
    return t;
  }
  // A finalized descriptor of `type` computing in `compute` (attribute `precision`), with `more`
  // attributes set first.
  template <typename More>
  cudnnBackendDescriptor_t computing(cudnnBackendDescriptorType_t type,
                                     cudnnBackendAttributeName_t precision, More&& more,
                                     cudnnDataType_t compute = CUDNN_DATA_FLOAT) {
    cudnnBackendDescriptor_t d = create(type);
    if constexpr (!std::is_null_pointer_v<std::decay_t<More>>) more(d);
    set(d, precision, CUDNN_TYPE_DATA_TYPE, 1, &compute);
    finalize(d);
    return d;
  }
  // An operation node with these descriptor attributes, finalized and added to the graph.
  void operation(
      cudnnBackendDescriptorType_t type,
      const std::vector<std::pair<cudnnBackendAttributeName_t, cudnnBackendDescriptor_t>>& descs) {
    cudnnBackendDescriptor_t op = create(type);
    for (const auto& [name, desc] : descs)
      set(op, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &desc);
    finalize(op);
    if (status_.is_ok()) operations_.push_back(op);
  }

  const CudnnApi& api_;
  SdpaSpec spec_;
  cudnnDataType_t io_ = CUDNN_DATA_BFLOAT16;
  float negative_infinity_ = 0.0f;
  bool backward_ = false;
  std::string node_;
  Status status_;
  std::vector<Descriptor> owned_;
  std::vector<cudnnBackendDescriptor_t> operations_;
  std::vector<std::pair<std::int64_t, float>> scalars_;
  std::int64_t next_virtual_ = kFirstVirtual;
};

// The layouts of one pass (B batch rows of T tokens; q, out (B*T, H*D); k, v (B*T, KV*D)).
struct Layout {
  std::int64_t B, T, H, KV, D;
  explicit Layout(const SdpaSpec& s)
      : B(s.batch), T(s.seq_len), H(s.heads), KV(s.kv_heads), D(s.head_dim) {}
  Dims q() const { return {B, H, T, D}; }
  Dims q_strides() const { return {T * H * D, D, H * D, 1}; }
  Dims kv() const { return {B, KV, T, D}; }
  Dims kv_strides() const { return {T * KV * D, D, KV * D, 1}; }
  Dims kv_t() const { return {B, KV, D, T}; }  // Kᵀ, Vᵀ over the same elements
  Dims kv_t_strides() const { return {T * KV * D, D, 1, KV * D}; }
  Dims scores() const { return {B, H, T, T}; }
  Dims scores_t_strides() const { return {H * T * T, T * T, 1, T}; }
  Dims rows() const { return {B, H, T, 1}; }  // the stats: Strata's lse (B, H, T)
  Dims full_heads() const { return {B, H, T, D}; }
};

void build_forward(Builder& b, const SdpaSpec& spec) {
  const Layout l(spec);
  const Tensor q = b.tensor(kQ, l.q(), l.q_strides(), b.io());
  const Tensor kt = b.tensor(kK, l.kv_t(), l.kv_t_strides(), b.io());
  const Tensor v = b.tensor(kV, l.kv(), l.kv_strides(), b.io());
  const Tensor o = b.tensor(kO, l.q(), l.q_strides(), b.io());
  const Tensor stats = b.tensor(kStats, l.rows(), packed_strides(l.rows()), CUDNN_DATA_FLOAT);
  const Tensor scale = b.scalar(spec.scale);

  Tensor s = b.matmul("Q·Kᵀ", q, kt, l.scores(), packed_strides(l.scores()), CUDNN_DATA_FLOAT);
  s = b.binary("× scale", CUDNN_POINTWISE_MUL, s, scale);
  s = b.mask(s);
  const Tensor max = b.reduction("row max", CUDNN_REDUCE_TENSOR_MAX, s, l.rows(),
                                 packed_strides(l.rows()), CUDNN_DATA_FLOAT);
  const Tensor centred = b.binary("− max", CUDNN_POINTWISE_SUB, s, max);
  const Tensor e = b.pointwise("exp", CUDNN_POINTWISE_EXP, centred);
  const Tensor sum = b.reduction("row sum", CUDNN_REDUCE_TENSOR_ADD, e, l.rows(),
                                 packed_strides(l.rows()), CUDNN_DATA_FLOAT);
  const Tensor log_sum = b.pointwise("log", CUDNN_POINTWISE_LOG, sum);
  b.binary("stats = max + log Σexp", CUDNN_POINTWISE_ADD, max, log_sum, CUDNN_DATA_FLOAT,
           CUDNN_DATA_FLOAT, &stats);
  const Tensor p = b.binary("P = exp / Σexp", CUDNN_POINTWISE_DIV, e, sum, b.io());
  b.matmul("P·V", p, v, l.q(), l.q_strides(), b.io(), &o);
}

void build_backward(Builder& b, const SdpaSpec& spec) {
  b.set_backward(true);
  const Layout l(spec);
  const Tensor q = b.tensor(kQ, l.q(), l.q_strides(), b.io());
  const Tensor kt = b.tensor(kK, l.kv_t(), l.kv_t_strides(), b.io());
  const Tensor vt = b.tensor(kV, l.kv_t(), l.kv_t_strides(), b.io());
  const Tensor o = b.tensor(kO, l.q(), l.q_strides(), b.io());
  const Tensor d_o = b.tensor(kDO, l.q(), l.q_strides(), b.io());
  const Tensor stats = b.tensor(kStats, l.rows(), packed_strides(l.rows()), CUDNN_DATA_FLOAT);
  const Tensor dq = b.tensor(kDQ, l.q(), l.q_strides(), b.io());
  const Tensor dk = b.tensor(kDK, l.kv(), l.kv_strides(), b.io());
  const Tensor dv = b.tensor(kDV, l.kv(), l.kv_strides(), b.io());
  const Tensor softmax_sum =
      b.tensor(kSoftmaxSum, l.rows(), packed_strides(l.rows()), CUDNN_DATA_FLOAT);
  const Tensor scale = b.scalar(spec.scale);
  const Tensor one = b.scalar(1.0f);

  // rowsum(dO∘O), kept in the call's memory (the flash staging's delta).
  Tensor d = b.binary("dO∘O", CUDNN_POINTWISE_MUL, d_o, o);
  d = b.reduction("rowsum(dO∘O)", CUDNN_REDUCE_TENSOR_ADD, d, l.rows(), packed_strides(l.rows()),
                  CUDNN_DATA_FLOAT);
  b.binary("softmax sum", CUDNN_POINTWISE_MUL, d, one, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT,
           &softmax_sum);

  // P recomputed from the forward's stats.
  Tensor s = b.matmul("Q·Kᵀ", q, kt, l.scores(), packed_strides(l.scores()), CUDNN_DATA_FLOAT);
  s = b.binary("× scale", CUDNN_POINTWISE_MUL, s, scale);
  s = b.binary("− stats", CUDNN_POINTWISE_SUB, s, stats);
  s = b.mask(s);
  const Tensor p = b.pointwise("P = exp", CUDNN_POINTWISE_EXP, s);

  // dV = Pᵀ·dO, and dK = dSᵀ·Q: a product per query head, summed over each KV head's group.
  const auto grad_kv = [&](const char* name, const char* group_name, const Tensor& left_t,
                           const Tensor& right, const Tensor& out) {
    if (l.H == l.KV) {
      b.matmul(name, left_t, right, l.kv(), l.kv_strides(), b.io(), &out);
      return;
    }
    const Tensor full =
        b.matmul(name, left_t, right, l.full_heads(), packed_strides(l.full_heads()), b.io());
    b.reduction(group_name, CUDNN_REDUCE_TENSOR_ADD, full, l.kv(), l.kv_strides(), b.io(), &out);
  };
  const Tensor p_t = b.reshape("Pᵀ", p, l.scores(), l.scores_t_strides(), b.io());
  grad_kv("Pᵀ·dO", "dV over the group", p_t, d_o, dv);

  Tensor ds = b.matmul("dO·Vᵀ", d_o, vt, l.scores(), packed_strides(l.scores()), CUDNN_DATA_FLOAT);
  ds = b.binary("− softmax sum", CUDNN_POINTWISE_SUB, ds, softmax_sum);
  ds = b.binary("∘ P", CUDNN_POINTWISE_MUL, ds, p);
  ds = b.binary("dS × scale", CUDNN_POINTWISE_MUL, ds, scale);
  const Tensor ds_t = b.reshape("dSᵀ", ds, l.scores(), l.scores_t_strides(), b.io());
  grad_kv("dSᵀ·Q", "dK over the group", ds_t, q, dk);

  // dQ = dS·K straight into dQ (the deterministic form: no fp32 accumulator with atomics).
  const Tensor k = b.reshape("K", kt, l.kv(), l.kv_strides(), b.io());
  b.matmul("dS·K", ds, k, l.q(), l.q_strides(), b.io(), &dq);
}

void build(Builder& b, const SdpaSpec& spec, bool backward) {
  if (backward) {
    build_backward(b, spec);
  } else {
    build_forward(b, spec);
  }
}

}  // namespace

SdpaSpec sdpa_spec(const kernels::AttentionShape& pass, bool bf16) {
  SdpaSpec s;
  s.batch = pass.batch;
  s.seq_len = pass.seq_len;
  s.heads = pass.heads;
  s.kv_heads = pass.kv_heads;
  s.head_dim = pass.head_dim;
  s.window = pass.window;
  s.scale = static_cast<float>(pass.scale);
  s.bf16 = bf16;
  return s;
}

Result<int> finalize_sdpa_nodes(const CudnnApi& api, const SdpaSpec& spec, bool backward) {
  Builder b(api, spec);
  build(b, spec, backward);
  if (!b.status().is_ok()) return b.status();
  return static_cast<int>(b.operations().size());
}

// One direction's graph, finalized into an execution plan, with the scalars its calls pass.
struct CudnnPlan {
  std::vector<Descriptor> owned;  // the graph's descriptors, the plan's last
  cudnnBackendDescriptor_t plan = nullptr;
  std::vector<std::pair<std::int64_t, float>> scalars;
  std::int64_t workspace_bytes = 0;
};

struct CudnnAttention::Plans {
  CudnnPlan forward, backward;
  Status status;  // why this spec does not run here
};

// The handle (never destroyed: it lives as long as the process, as the CUDA context does) and the
// plans by spec and lent workspace size, behind one lock.
struct CudnnAttention::Device {
  const CudnnApi* api = nullptr;
  cudnnHandle_t handle = nullptr;
  std::mutex mutex;
  std::map<std::pair<SdpaSpec, std::size_t>, std::unique_ptr<Plans>> plans;
};

namespace {

Status make_plan(const CudnnApi& api, cudnnHandle_t handle, const SdpaSpec& spec, bool backward,
                 std::size_t workspace_bytes, CudnnPlan* out) {
  Builder b(api, spec);
  build(b, spec, backward);
  if (!b.status().is_ok()) return b.status();
  const char* direction = backward ? "backward" : "forward";
  const auto refused = [&](const std::string& what, cudnnStatus_t st) {
    return Status(ErrorCode::kUnavailable,
                  fmt::format("cuDNN refused the {} attention graph: {}: {}", direction, what,
                              api.describe(st)),
                  "cuDNN");
  };
  const auto make = [&](cudnnBackendDescriptorType_t type, Descriptor* d) {
    cudnnBackendDescriptor_t raw = nullptr;
    const cudnnStatus_t st = api.create_descriptor(type, &raw);
    *d = Descriptor(&api, raw);
    return st;
  };

  Descriptor graph;
  cudnnStatus_t st = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &graph);
  const std::vector<cudnnBackendDescriptor_t>& ops = b.operations();
  cudnnBackendDescriptor_t g = graph.get();
  if (st == CUDNN_STATUS_SUCCESS)
    st = api.set_attribute(g, kGraphHandle, CUDNN_TYPE_HANDLE, 1, &handle);
  if (st == CUDNN_STATUS_SUCCESS) {
    st = api.set_attribute(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                           static_cast<std::int64_t>(ops.size()), ops.data());
  }
  if (st == CUDNN_STATUS_SUCCESS) st = api.finalize(g);
  if (st != CUDNN_STATUS_SUCCESS) return refused("the operation graph", st);

  // The heuristics' engines (mode A, then the fallback list): the first that is deterministic,
  // builds a plan and fits the workspace.
  std::string passed_over;
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    const char* mode_name = mode == CUDNN_HEUR_MODE_A ? "mode A" : "fallback";
    const auto note = [&](const std::string& what) {
      passed_over += fmt::format("{}{}: {}", passed_over.empty() ? "" : "; ", mode_name, what);
    };
    Descriptor heuristics;
    st = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heuristics);
    cudnnBackendDescriptor_t h = heuristics.get();
    if (st == CUDNN_STATUS_SUCCESS) {
      st = api.set_attribute(h, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g);
    }
    if (st == CUDNN_STATUS_SUCCESS) {
      st = api.set_attribute(h, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    }
    if (st == CUDNN_STATUS_SUCCESS) st = api.finalize(h);
    std::int64_t count = 0;
    if (st == CUDNN_STATUS_SUCCESS) {
      st = api.get_attribute(h, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                             &count, nullptr);
    }
    if (st != CUDNN_STATUS_SUCCESS) {
      note(fmt::format("heuristics: {}", api.describe(st)));
      continue;
    }
    if (count <= 0) {
      note("heuristics offered no engine");
      continue;
    }
    std::vector<Descriptor> configs(static_cast<std::size_t>(count));
    std::vector<cudnnBackendDescriptor_t> raw(configs.size());
    for (std::size_t i = 0; i < configs.size(); ++i) {
      st = make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &configs[i]);
      if (st != CUDNN_STATUS_SUCCESS) return refused("an engine configuration", st);
      raw[i] = configs[i].get();
    }
    std::int64_t got = 0;
    st = api.get_attribute(h, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                           &got, raw.data());
    if (st != CUDNN_STATUS_SUCCESS) {
      note(fmt::format("heuristics' results: {}", api.describe(st)));
      continue;
    }

    // The first engine that is deterministic, builds a plan and fits the workspace.
    for (std::int64_t i = 0; i < got; ++i) {
      cudnnBackendDescriptor_t config = raw[static_cast<std::size_t>(i)];
      Descriptor engine;
      if (make(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) != CUDNN_STATUS_SUCCESS) continue;
      cudnnBackendDescriptor_t e = engine.get();
      std::int64_t n = 0;
      if (api.get_attribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                            &n, &e) != CUDNN_STATUS_SUCCESS) {
        continue;
      }
      std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
      std::int64_t note_count = 0;
      if (api.get_attribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                            static_cast<std::int64_t>(notes.size()), &note_count,
                            notes.data()) != CUDNN_STATUS_SUCCESS) {
        continue;
      }
      bool deterministic = true;
      for (std::int64_t j = 0; j < note_count; ++j) {
        deterministic &=
            notes[static_cast<std::size_t>(j)] != CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
      }
      if (!deterministic) {
        note(fmt::format("engine {}: nondeterministic", i));
        continue;
      }
      Descriptor plan;
      st = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
      cudnnBackendDescriptor_t p = plan.get();
      if (st == CUDNN_STATUS_SUCCESS)
        st = api.set_attribute(p, kPlanHandle, CUDNN_TYPE_HANDLE, 1, &handle);
      if (st == CUDNN_STATUS_SUCCESS) {
        st = api.set_attribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &config);
      }
      if (st == CUDNN_STATUS_SUCCESS) st = api.finalize(p);
      if (st != CUDNN_STATUS_SUCCESS) {
        note(fmt::format("engine {}: {}", i, api.describe(st)));
        continue;
      }
      std::int64_t workspace = 0;
      st = api.get_attribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                             &workspace);
      if (st != CUDNN_STATUS_SUCCESS) continue;
      if (workspace < 0 || static_cast<std::uint64_t>(workspace) > workspace_bytes) {
        note(fmt::format("engine {}: needs {} bytes of workspace, {} lent", i, workspace,
                         workspace_bytes));
        continue;
      }
      out->owned = b.take_owned();
      out->owned.push_back(std::move(graph));
      out->owned.push_back(std::move(heuristics));
      for (Descriptor& c : configs)
        out->owned.push_back(std::move(c));
      out->owned.push_back(std::move(engine));
      out->plan = p;
      out->owned.push_back(std::move(plan));
      out->scalars = b.scalars();
      out->workspace_bytes = workspace;
      return Status::ok();
    }
  }
  return Status(ErrorCode::kUnavailable,
                fmt::format("no cuDNN engine runs the {} attention graph here{}{}", direction,
                            passed_over.empty() ? "" : ": ", passed_over),
                "cuDNN");
}

}  // namespace

Result<std::unique_ptr<CudnnAttention>> CudnnAttention::create(cudaStream_t stream, void* workspace,
                                                               std::size_t workspace_bytes) {
  STRATA_ASSIGN_OR_RETURN(const CudnnApi* api, load_cudnn());
  int ordinal = 0;
  if (const cudaError_t err = cudaGetDevice(&ordinal); err != cudaSuccess) {
    return Status(ErrorCode::kUnavailable,
                  fmt::format("cudaGetDevice failed: {}", cudaGetErrorString(err)), "cuDNN");
  }
  static std::mutex devices_mutex;
  static std::map<int, Device*>* devices = new std::map<int, Device*>();  // lives to the end
  std::lock_guard<std::mutex> lock(devices_mutex);
  Device*& device = (*devices)[ordinal];
  if (device == nullptr) {
    cudnnHandle_t handle = nullptr;
    const cudnnStatus_t st = api->create(&handle);
    if (st != CUDNN_STATUS_SUCCESS) {
      return Status(ErrorCode::kUnavailable,
                    fmt::format("cudnnCreate failed on GPU {}: {}", ordinal, api->describe(st)),
                    "cuDNN");
    }
    device = new Device();
    device->api = api;
    device->handle = handle;
  }
  return std::unique_ptr<CudnnAttention>(
      new CudnnAttention(device, stream, workspace, workspace_bytes));
}

CudnnAttention::CudnnAttention(Device* device, cudaStream_t stream, void* workspace,
                               std::size_t workspace_bytes)
    : device_(device), stream_(stream), workspace_(workspace), workspace_bytes_(workspace_bytes) {}

std::unique_ptr<CudnnAttention> CudnnAttention::for_test(const CudnnApi* api, void* handle,
                                                         cudaStream_t stream, void* workspace,
                                                         std::size_t workspace_bytes) {
  auto device = std::make_unique<Device>();
  device->api = api;
  device->handle = static_cast<cudnnHandle_t>(handle);
  std::unique_ptr<CudnnAttention> made(
      new CudnnAttention(device.get(), stream, workspace, workspace_bytes));
  made->own_device_ = std::move(device);
  return made;
}

CudnnAttention::~CudnnAttention() = default;

std::string CudnnAttention::describe() const {
  const CudnnApi& api = *device_->api;
  return fmt::format("cuDNN {}.{}.{} ({})", api.version / 10000, api.version / 100 % 100,
                     api.version % 100, api.path);
}

Status CudnnAttention::prepare(const SdpaSpec& spec) {
  std::lock_guard<std::mutex> lock(device_->mutex);
  const auto key = std::make_pair(spec, workspace_bytes_);
  auto found = device_->plans.find(key);
  if (found != device_->plans.end()) return found->second->status;
  auto plans = std::make_unique<Plans>();
  const CudnnApi& api = *device_->api;
  plans->status = make_plan(api, device_->handle, spec, false, workspace_bytes_, &plans->forward);
  if (plans->status.is_ok()) {
    plans->status = make_plan(api, device_->handle, spec, true, workspace_bytes_, &plans->backward);
  }
  const Status status = plans->status;
  device_->plans.emplace(key, std::move(plans));
  return status;
}

const CudnnAttention::Plans* CudnnAttention::find(const kernels::AttentionShape& pass) const {
  std::lock_guard<std::mutex> lock(device_->mutex);
  auto found = device_->plans.find(std::make_pair(sdpa_spec(pass, bf16_), workspace_bytes_));
  if (found == device_->plans.end() || !found->second->status.is_ok()) {
    error_ = Status(ErrorCode::kInternal,
                    fmt::format("the cuDNN attention was called for a shape it did not prepare "
                                "(batch {}, seq_len {}, heads {}/{}, head_dim {})",
                                pass.batch, pass.seq_len, pass.heads, pass.kv_heads, pass.head_dim),
                    "cuDNN");
    return nullptr;
  }
  return found->second.get();  // plans are never removed
}

cudaError_t CudnnAttention::run(const Plans& plans, bool backward,
                                const void* const* pointers) const {
  const CudnnPlan& plan = backward ? plans.backward : plans.forward;
  const int tensors = backward ? 10 : 5;  // the uids kQ.. in order
  std::vector<std::int64_t> uids;
  std::vector<void*> data;
  for (int i = 0; i < tensors; ++i) {
    uids.push_back(kQ + i);
    data.push_back(const_cast<void*>(pointers[i]));
  }
  for (const auto& [uid, value] : plan.scalars) {
    uids.push_back(uid);
    data.push_back(const_cast<float*>(&value));
  }
  const CudnnApi* api = device_->api;
  cudnnBackendDescriptor_t pack = nullptr;
  cudnnStatus_t st = api->create_descriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
  const Descriptor owned(api, pack);
  void* workspace = workspace_;
  if (st == CUDNN_STATUS_SUCCESS) {
    st = api->set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                            static_cast<std::int64_t>(uids.size()), uids.data());
  }
  if (st == CUDNN_STATUS_SUCCESS) {
    st = api->set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                            static_cast<std::int64_t>(data.size()), data.data());
  }
  if (st == CUDNN_STATUS_SUCCESS) {
    st = api->set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                            &workspace);
  }
  if (st == CUDNN_STATUS_SUCCESS) st = api->finalize(pack);
  if (st == CUDNN_STATUS_SUCCESS) {
    // The device's one handle: this call's stream on it, then the work enqueued.
    std::lock_guard<std::mutex> lock(device_->mutex);
    st = api->set_stream(device_->handle, stream_);
    if (st == CUDNN_STATUS_SUCCESS) st = api->execute(device_->handle, plan.plan, pack);
  }
  if (st == CUDNN_STATUS_SUCCESS) return cudaSuccess;
  error_ = Status(ErrorCode::kInternal,
                  fmt::format("the cuDNN attention {} failed: {}",
                              backward ? "backward" : "forward", api->describe(st)),
                  "cuDNN");
  return cudaErrorUnknown;
}

cudaError_t CudnnAttention::forward(std::uint16_t* out, float* lse, const std::uint16_t* q,
                                    const std::uint16_t* k, const std::uint16_t* v,
                                    const kernels::AttentionShape& pass) const {
  const Plans* plans = find(pass);
  if (plans == nullptr) return cudaErrorUnknown;
  const void* pointers[] = {q, k, v, out, lse};
  return run(*plans, false, pointers);
}

cudaError_t CudnnAttention::backward(std::uint16_t* dq, std::uint16_t* dk, std::uint16_t* dv,
                                     float* delta, const std::uint16_t* dout,
                                     const std::uint16_t* out, const float* lse,
                                     const std::uint16_t* q, const std::uint16_t* k,
                                     const std::uint16_t* v,
                                     const kernels::AttentionShape& pass) const {
  const Plans* plans = find(pass);
  if (plans == nullptr) return cudaErrorUnknown;
  const void* pointers[] = {q, k, v, out, lse, dout, dq, dk, dv, delta};
  return run(*plans, true, pointers);
}

Status CudnnAttention::take_error() const {
  return std::exchange(error_, Status::ok());
}

}  // STRATA_CUDA_NAMESPACE(cuda)
