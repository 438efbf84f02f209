// Fused Adam/AdamW step for fp32 CPU tensors, optionally writing the updated
// weights into a half-precision copy in the same pass (what ZeRO-Offload needs:
// the fp32 master stays on the host, the fp16/bf16 copy goes back to the model).
//
// The arithmetic follows torch.optim.Adam/AdamW's single-tensor path operation
// by operation (lerp for the first moment, addcmul for the second, divide by the
// bias-corrected sqrt, addcdiv), so results agree with torch to a few ulps.
// Each thread of at::parallel_for runs a `#pragma omp simd` loop over its slice;
// with -O3 -march=native the compiler emits AVX2/AVX-512 code for the host.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

// Elements per parallel task: large enough to amortise scheduling, small
// enough that 100M-element tensors spread over every core.
constexpr int64_t kGrainSize = 1 << 15;

enum class CopyKind { kNone, kHalf, kBFloat16 };

struct AdamScalars {
  float lr;
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float eps;
  float weight_decay;
  float decay_factor;      // AdamW: 1 - lr * wd, applied to the weights first
  float neg_step_size;     // -lr / (1 - beta1^t)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  bool l2_into_grad;       // Adam: grad += wd * param
};

// Round-to-nearest-even fp32 -> bf16, the same rounding as tensor.to(bfloat16);
// written with integer ops so the loop vectorises without bf16 hardware.
inline uint16_t float_to_bf16_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint32_t rounding_bias = 0x7FFFu + ((bits >> 16) & 1u);
  const uint32_t rounded = (bits + rounding_bias) >> 16;
  const bool is_nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  return is_nan ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
}

// Elements per inner block: the copy-out reads back weights the Adam loop just
// wrote while they are still in L1, as its own loop so that each vectorises.
constexpr int64_t kCopyBlock = 2048;

inline void adam_block(float* __restrict__ param, const float* __restrict__ grad,
                       float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq,
                       int64_t begin, int64_t end, const AdamScalars& s) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    float p = param[i];
    float g = grad[i];
    if (s.l2_into_grad) g = std::fma(p, s.weight_decay, g);  // grad.add(param, alpha=wd): an fma in torch
    p = p * s.decay_factor;
    float m = exp_avg[i];
    m = std::fma(s.one_minus_beta1, g - m, m);      // exp_avg.lerp_(grad, 1 - beta1), fused as torch's
    float v = exp_avg_sq[i] * s.beta2;
    v = v + s.one_minus_beta2 * g * g;              // addcmul_(grad, grad, 1 - beta2)
    const float denom = std::sqrt(v) / s.bias_correction2_sqrt + s.eps;
    p = p + s.neg_step_size * m / denom;            // addcdiv_(m, denom, -step_size)
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = p;
  }
}

// param[begin:end] cast into the fp16/bf16 copy. GCC 12 does not vectorise
// these conversions by itself, so the AVX-512 path is written out; the scalar
// loop finishes the tail (and is all there is on other CPUs).
template <CopyKind kCopy>
void copy_out_block(const float* __restrict__ src, void* __restrict__ dst, int64_t begin, int64_t end) {
  auto* half_out = static_cast<_Float16*>(dst);
  auto* bf16_out = static_cast<uint16_t*>(dst);
  int64_t i = begin;
#if defined(__AVX512F__)
  for (; i + 16 <= end; i += 16) {
    const __m512 x = _mm512_loadu_ps(src + i);
    if constexpr (kCopy == CopyKind::kHalf) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(half_out + i),
                          _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
      const __m512i bits = _mm512_castps_si512(x);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
      __m512i rounded = _mm512_srli_epi32(
          _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
      const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
      rounded = _mm512_mask_mov_epi32(rounded, is_nan, _mm512_set1_epi32(0x7FC0));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(bf16_out + i), _mm512_cvtepi32_epi16(rounded));
    }
  }
#endif
  for (; i < end; ++i) {
    if constexpr (kCopy == CopyKind::kHalf) half_out[i] = static_cast<_Float16>(src[i]);
    else bf16_out[i] = float_to_bf16_bits(src[i]);
  }
}

template <CopyKind kCopy>
void adam_kernel(float* __restrict__ param, const float* __restrict__ grad,
                 float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq,
                 void* __restrict__ copy_out, int64_t begin, int64_t end,
                 const AdamScalars s) {
  if constexpr (kCopy == CopyKind::kNone) {
    adam_block(param, grad, exp_avg, exp_avg_sq, begin, end, s);
    return;
  }
  for (int64_t block = begin; block < end; block += kCopyBlock) {
    const int64_t block_end = std::min(end, block + kCopyBlock);
    adam_block(param, grad, exp_avg, exp_avg_sq, block, block_end, s);
    copy_out_block<kCopy>(param, copy_out, block, block_end);
  }
}

void check_state_tensor(const at::Tensor& t, const at::Tensor& param, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "cpu_adam: ", name, " must be a CPU tensor, got ", t.device());
  TORCH_CHECK(t.scalar_type() == at::kFloat, "cpu_adam: ", name,
              " must be float32 (fp32 master state), got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), "cpu_adam: ", name, " must be contiguous");
  TORCH_CHECK(t.numel() == param.numel(), "cpu_adam: ", name, " has ", t.numel(),
              " elements but param has ", param.numel());
}

// One Adam/AdamW step on a single parameter tensor. `copy_out`, when given,
// receives the updated weights cast to its dtype (float16 or bfloat16).
void adam_update(at::Tensor param, at::Tensor grad, at::Tensor exp_avg, at::Tensor exp_avg_sq,
                 int64_t step, double lr, double beta1, double beta2, double eps,
                 double weight_decay, bool bias_correction, bool adamw_mode,
                 c10::optional<at::Tensor> copy_out) {
  check_state_tensor(param, param, "param");
  check_state_tensor(grad, param, "grad");
  check_state_tensor(exp_avg, param, "exp_avg");
  check_state_tensor(exp_avg_sq, param, "exp_avg_sq");
  TORCH_CHECK(step >= 1, "cpu_adam: step must be >= 1, got ", step);
  TORCH_CHECK(lr >= 0.0, "cpu_adam: invalid learning rate ", lr);
  TORCH_CHECK(eps >= 0.0, "cpu_adam: invalid eps ", eps);
  TORCH_CHECK(beta1 >= 0.0 && beta1 < 1.0, "cpu_adam: invalid beta1 ", beta1);
  TORCH_CHECK(beta2 >= 0.0 && beta2 < 1.0, "cpu_adam: invalid beta2 ", beta2);

  CopyKind copy_kind = CopyKind::kNone;
  void* copy_ptr = nullptr;
  if (copy_out.has_value()) {
    const at::Tensor& out = *copy_out;
    TORCH_CHECK(out.device().is_cpu(), "cpu_adam: copy_to must be a CPU tensor, got ", out.device());
    TORCH_CHECK(out.is_contiguous(), "cpu_adam: copy_to must be contiguous");
    TORCH_CHECK(out.numel() == param.numel(), "cpu_adam: copy_to has ", out.numel(),
                " elements but param has ", param.numel());
    if (out.scalar_type() == at::kHalf) {
      copy_kind = CopyKind::kHalf;
    } else if (out.scalar_type() == at::kBFloat16) {
      copy_kind = CopyKind::kBFloat16;
    } else {
      TORCH_CHECK(false, "cpu_adam: copy_to must be float16 or bfloat16, got ", out.scalar_type());
    }
    copy_ptr = out.data_ptr();
  }

  // Scalars are computed in double, as Python computes them for torch.optim.
  const double bias_correction1 = bias_correction ? 1.0 - std::pow(beta1, step) : 1.0;
  const double bias_correction2 = bias_correction ? 1.0 - std::pow(beta2, step) : 1.0;
  AdamScalars s;
  s.lr = static_cast<float>(lr);
  s.beta1 = static_cast<float>(beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  s.eps = static_cast<float>(eps);
  s.weight_decay = static_cast<float>(weight_decay);
  s.l2_into_grad = !adamw_mode && weight_decay != 0.0;
  s.decay_factor = adamw_mode ? static_cast<float>(1.0 - lr * weight_decay) : 1.0f;
  s.neg_step_size = static_cast<float>(-(lr / bias_correction1));
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));

  float* p = param.data_ptr<float>();
  const float* g = grad.data_ptr<float>();
  float* m = exp_avg.data_ptr<float>();
  float* v = exp_avg_sq.data_ptr<float>();
  at::parallel_for(0, param.numel(), kGrainSize, [&](int64_t begin, int64_t end) {
    switch (copy_kind) {
      case CopyKind::kNone: adam_kernel<CopyKind::kNone>(p, g, m, v, nullptr, begin, end, s); break;
      case CopyKind::kHalf: adam_kernel<CopyKind::kHalf>(p, g, m, v, copy_ptr, begin, end, s); break;
      case CopyKind::kBFloat16: adam_kernel<CopyKind::kBFloat16>(p, g, m, v, copy_ptr, begin, end, s); break;
    }
  });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "rankscope fused CPU Adam/AdamW (fp32 master weights, optional fp16/bf16 copy-out)";
  m.def("adam_update", &adam_update, "One fused Adam/AdamW step on one fp32 tensor",
        py::arg("param"), py::arg("grad"), py::arg("exp_avg"), py::arg("exp_avg_sq"),
        py::arg("step"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
        py::arg("weight_decay"), py::arg("bias_correction"), py::arg("adamw_mode"),
        py::arg("copy_out") = py::none(),
        py::call_guard<py::gil_scoped_release>());
}
