// Fused elementwise middles of the rank-1 factored layers on CPU (see qkmlp/cpu_kernels.py).
//
// Each kernel makes one pass over contiguous arrays of n = N·m numbers, where eager PyTorch
// makes two (forward) or five (backward) passes, each reading and writing memory:
//
//   gated_forward       h = σ(a)·b
//   gated_backward      from a, b and dh (passed in the db slot):
//                       da = dh·b·σ'(a),  db = dh·σ(a),  h = σ(a)·b
//   symmetric_forward   h = σ(a·b)
//   symmetric_backward  with p = a·b:  dp = dh·σ'(p),  da = dp·b,  db = dp·a,  h = σ(p)
//
// The backward kernels overwrite dh with db (each element is read before it is written).
// Work is split over torch's intra-op threads (at::parallel_for honours
// torch.set_num_threads); the inner loops are plain enough for the compiler to vectorise.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

enum Act : int64_t { IDENTITY = 0, RELU = 1, SILU = 2, GELU = 3 };

constexpr int64_t kGrain = 16384;

// NaN test on the bits: the kernels are built with -ffast-math (so that exp and erf
// vectorise), under which the compiler may assume z == z.
template <typename T>
inline bool is_nan(T z) {
  if constexpr (sizeof(T) == 4) {
    std::uint32_t u;
    std::memcpy(&u, &z, 4);
    return (u & 0x7fffffffu) > 0x7f800000u;
  } else {
    std::uint64_t u;
    std::memcpy(&u, &z, 8);
    return (u & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
  }
}

// σ(z) and σ'(z) for the activation ACT, as torch.nn.functional defines them.
template <typename T, int64_t ACT>
inline void act(T z, T& f, T& df) {
  if constexpr (ACT == IDENTITY) {
    f = z;
    df = T(1);
  } else if constexpr (ACT == RELU) {
    // NaN propagates as in torch.relu; the derivative at 0 is 0 as in threshold_backward
    f = (z > T(0) || is_nan(z)) ? z : T(0);
    df = z > T(0) ? T(1) : T(0);
  } else if constexpr (ACT == SILU) {
    const T s = T(1) / (T(1) + std::exp(-z));
    f = z * s;
    df = s * (T(1) + z * (T(1) - s));
  } else {  // GELU, exact (erf) form
    const T kInvSqrt2 = T(0.70710678118654752440);
    const T kInvSqrt2Pi = T(0.39894228040143267794);
    const T cdf = T(0.5) * (T(1) + std::erf(z * kInvSqrt2));
    f = z * cdf;
    df = cdf + z * kInvSqrt2Pi * std::exp(T(-0.5) * z * z);
  }
}

// Arrays never overlap except dh_db, which each kernel reads before writing the same
// element; __restrict__ and omp simd let the compiler vectorise exp and erf (libmvec).
template <typename T, int64_t ACT>
void gated_forward_impl(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ h, int64_t n) {
  at::parallel_for(0, n, kGrain, [=](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      T f, df;
      act<T, ACT>(a[i], f, df);
      h[i] = f * b[i];
    }
  });
}

template <typename T, int64_t ACT>
void gated_backward_impl(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ dh_db,
                         T* __restrict__ da, T* __restrict__ h, int64_t n) {
  at::parallel_for(0, n, kGrain, [=](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      T f, df;
      act<T, ACT>(a[i], f, df);
      const T g = dh_db[i], bi = b[i];
      da[i] = g * bi * df;
      dh_db[i] = g * f;
      h[i] = f * bi;
    }
  });
}

template <typename T, int64_t ACT>
void symmetric_forward_impl(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ h,
                            int64_t n) {
  at::parallel_for(0, n, kGrain, [=](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      T f, df;
      act<T, ACT>(a[i] * b[i], f, df);
      h[i] = f;
    }
  });
}

template <typename T, int64_t ACT>
void symmetric_backward_impl(const T* __restrict__ a, const T* __restrict__ b,
                             T* __restrict__ dh_db, T* __restrict__ da, T* __restrict__ h, int64_t n) {
  at::parallel_for(0, n, kGrain, [=](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      const T ai = a[i], bi = b[i];
      T f, df;
      act<T, ACT>(ai * bi, f, df);
      const T dp = dh_db[i] * df;
      da[i] = dp * bi;
      dh_db[i] = dp * ai;
      h[i] = f;
    }
  });
}

void check(const std::vector<torch::Tensor>& ts, const char* what) {
  const auto& t0 = ts[0];
  TORCH_CHECK(t0.device().is_cpu(), what, ": expected CPU tensors");
  TORCH_CHECK(t0.scalar_type() == at::kFloat || t0.scalar_type() == at::kDouble, what,
              ": expected float32 or float64, got ", t0.scalar_type());
  for (const auto& t : ts) {
    TORCH_CHECK(t.is_contiguous(), what, ": expected contiguous tensors");
    TORCH_CHECK(t.scalar_type() == t0.scalar_type(), what, ": expected one dtype for all tensors");
    TORCH_CHECK(t.numel() == t0.numel(), what, ": expected tensors of ", t0.numel(), " numbers, got ",
                t.numel());
  }
}

// Calls KERNEL<scalar_t, ACT> with ACT fixed at compile time from the runtime code.
#define QKMLP_DISPATCH(code, KERNEL, ...)                                               \
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), #KERNEL, [&] {                           \
    switch (code) {                                                                     \
      case IDENTITY: KERNEL<scalar_t, IDENTITY>(__VA_ARGS__); break;                    \
      case RELU: KERNEL<scalar_t, RELU>(__VA_ARGS__); break;                            \
      case SILU: KERNEL<scalar_t, SILU>(__VA_ARGS__); break;                            \
      case GELU: KERNEL<scalar_t, GELU>(__VA_ARGS__); break;                            \
      default: TORCH_CHECK(false, #KERNEL ": unknown activation code ", code);         \
    }                                                                                   \
  })

#define P(t) t.data_ptr<scalar_t>()

void gated_forward(torch::Tensor a, torch::Tensor b, torch::Tensor h, int64_t code) {
  check({a, b, h}, "gated_forward");
  QKMLP_DISPATCH(code, gated_forward_impl, P(a), P(b), P(h), a.numel());
}

void gated_backward(torch::Tensor a, torch::Tensor b, torch::Tensor dh_db, torch::Tensor da,
                    torch::Tensor h, int64_t code) {
  check({a, b, dh_db, da, h}, "gated_backward");
  QKMLP_DISPATCH(code, gated_backward_impl, P(a), P(b), P(dh_db), P(da), P(h), a.numel());
}

void symmetric_forward(torch::Tensor a, torch::Tensor b, torch::Tensor h, int64_t code) {
  check({a, b, h}, "symmetric_forward");
  QKMLP_DISPATCH(code, symmetric_forward_impl, P(a), P(b), P(h), a.numel());
}

void symmetric_backward(torch::Tensor a, torch::Tensor b, torch::Tensor dh_db, torch::Tensor da,
                        torch::Tensor h, int64_t code) {
  check({a, b, dh_db, da, h}, "symmetric_backward");
  QKMLP_DISPATCH(code, symmetric_backward_impl, P(a), P(b), P(dh_db), P(da), P(h), a.numel());
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gated_forward", &gated_forward, "h = act(a) * b");
  m.def("gated_backward", &gated_backward, "da, db (over dh), h of the gated middle");
  m.def("symmetric_forward", &symmetric_forward, "h = act(a * b)");
  m.def("symmetric_backward", &symmetric_backward, "da, db (over dh), h of the symmetric middle");
}
