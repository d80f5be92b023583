// y = x W^T for a few rows of x and a bfloat16 weight, on x86 CPUs with AVX2 + FMA but no bf16
// matrix units. torch's own bf16 kernels there cost one pass over the weight per row of x, so a
// verification of k tokens costs about k decoding steps; here each weight row is read once,
// widened to float32 in registers and multiplied with every row of x, so a few rows cost what
// one does (reading the weight). See draftsmith/core/bf16_rows.py.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cstring>
#include <vector>

namespace {

inline __m256 load_bf16(const uint16_t* p) {
  __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

inline float bf16_to_float(uint16_t b) {
  uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

// R rows of x (ldx apart) dotted with one weight row of `in` bf16 values; out[r * ldo].
template <int R>
inline void dot_rows(const uint16_t* w, const float* x, int64_t in, int64_t ldx, float* out,
                     int64_t ldo) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= in; i += 8) {
    __m256 wv = load_bf16(w + i);
    for (int r = 0; r < R; ++r)
      acc[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + r * ldx + i), acc[r]);
  }
  for (int r = 0; r < R; ++r) {
    float s = horizontal_sum(acc[r]);
    for (int64_t j = i; j < in; ++j) s += bf16_to_float(w[j]) * x[r * ldx + j];
    out[r * ldo] = s;
  }
}

using DotRows = void (*)(const uint16_t*, const float*, int64_t, int64_t, float*, int64_t);
constexpr int kTile = 8;  // rows of x per pass over a weight row: 8 accumulators + operands fit 16 ymm
constexpr DotRows kDot[kTile + 1] = {nullptr,      dot_rows<1>, dot_rows<2>, dot_rows<3>,
                                     dot_rows<4>, dot_rows<5>, dot_rows<6>, dot_rows<7>,
                                     dot_rows<8>};

}  // namespace

inline uint16_t float_to_bf16(float f) {  // round to nearest even, as torch rounds
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// x (..., in) and weight (out, in), bfloat16, optional bias (out,) -> (..., out) bfloat16: float32
// products and sums, rounded to bf16 once at the end. One call does it all: a forward makes
// hundreds of these calls, and each extra torch op would cost what a small layer's work does.
torch::Tensor linear_rows(const torch::Tensor& x, const torch::Tensor& weight,
                          const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && weight.scalar_type() == torch::kBFloat16,
              "x and weight must be bfloat16");
  TORCH_CHECK(weight.dim() == 2 && x.size(-1) == weight.size(1), "x (..., in), weight (out, in)");
  const int64_t in = weight.size(1), out = weight.size(0), rows = x.numel() / in;
  const torch::Tensor xc = x.contiguous(), wc = weight.contiguous();
  const auto* xb = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(wc.data_ptr<at::BFloat16>());
  std::vector<float> xf(rows * in);
  for (int64_t i = 0; i < rows * in; ++i) xf[i] = bf16_to_float(xb[i]);
  std::vector<float> bf(out, 0.0f);
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == torch::kBFloat16 && bias->numel() == out, "bias (out,)");
    const torch::Tensor bc = bias->contiguous();
    const auto* bp = reinterpret_cast<const uint16_t*>(bc.data_ptr<at::BFloat16>());
    for (int64_t o = 0; o < out; ++o) bf[o] = bf16_to_float(bp[o]);
  }
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out;
  torch::Tensor y = torch::empty(shape, x.options());
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  const float* xp = xf.data();
  at::parallel_for(0, out, 64, [&](int64_t begin, int64_t end) {
    float sums[kTile];
    for (int64_t o = begin; o < end; ++o) {
      for (int64_t r = 0; r < rows; r += kTile) {
        const int64_t n = std::min<int64_t>(kTile, rows - r);
        kDot[n](wp + o * in, xp + r * in, in, in, sums, 1);
        for (int64_t j = 0; j < n; ++j) yp[(r + j) * out + o] = float_to_bf16(sums[j] + bf[o]);
      }
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear_rows", &linear_rows, "bf16 x (..., in) @ weight (out, in)^T + bias, few rows");
}
