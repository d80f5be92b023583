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

// RW weight rows (ldw apart) dotted with RX rows of x (ldx apart), `in` values each:
// out[r * ldo + a] for x row r and weight row a. Each loaded weight vector serves RX rows and
// each x vector RW weight rows, so the loads per multiply-add fall as the tile grows.
template <int RW, int RX>
inline void dot_tile(const uint16_t* w, int64_t ldw, const float* x, int64_t ldx, int64_t in,
                     float* out, int64_t ldo) {
  __m256 acc[RW][RX];
  for (int a = 0; a < RW; ++a)
    for (int r = 0; r < RX; ++r) acc[a][r] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= in; i += 8) {
    __m256 wv[RW];
    for (int a = 0; a < RW; ++a) wv[a] = load_bf16(w + a * ldw + i);
    for (int r = 0; r < RX; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * ldx + i);
      for (int a = 0; a < RW; ++a) acc[a][r] = _mm256_fmadd_ps(wv[a], xv, acc[a][r]);
    }
  }
  for (int a = 0; a < RW; ++a)
    for (int r = 0; r < RX; ++r) {
      float s = horizontal_sum(acc[a][r]);
      for (int64_t j = i; j < in; ++j) s += bf16_to_float(w[a * ldw + j]) * x[r * ldx + j];
      out[r * ldo + a] = s;
    }
}

using DotTile = void (*)(const uint16_t*, int64_t, const float*, int64_t, int64_t, float*, int64_t);
// Tiles of up to 3 weight rows x 4 rows of x: 12 accumulators, 3 weight vectors and one x vector
// fill the 16 ymm registers (fastest of 2x4, 2x6, 3x4 and 4x3 on Zen 3, benchmarks/README.md).
constexpr int kTileW = 3, kTileX = 4;
constexpr DotTile kTile[kTileW][kTileX] = {
    {dot_tile<1, 1>, dot_tile<1, 2>, dot_tile<1, 3>, dot_tile<1, 4>},
    {dot_tile<2, 1>, dot_tile<2, 2>, dot_tile<2, 3>, dot_tile<2, 4>},
    {dot_tile<3, 1>, dot_tile<3, 2>, dot_tile<3, 3>, dot_tile<3, 4>}
};

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
    float sums[kTileX * kTileW];
    for (int64_t o = begin; o < end; o += kTileW) {
      const int64_t nw = std::min<int64_t>(kTileW, end - o);
      for (int64_t r = 0; r < rows; r += kTileX) {
        const int64_t nx = std::min<int64_t>(kTileX, rows - r);
        kTile[nw - 1][nx - 1](wp + o * in, in, xp + r * in, in, in, sums, kTileW);
        for (int64_t j = 0; j < nx; ++j)
          for (int64_t a = 0; a < nw; ++a)
            yp[(r + j) * out + o + a] = float_to_bf16(sums[j * kTileW + a] + bf[o + a]);
      }
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear_rows", &linear_rows, "bf16 x (..., in) @ weight (out, in)^T + bias, few rows");
}
