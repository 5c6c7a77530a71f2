// The torch entry of the fused decode products (`fused_product_kernel.cuh`); `fused_decode.py` builds it with torch's
// extension builder and calls `fused_product` on the current stream, writing into `out`.
//
// One configuration per product of a decode layer (tiles chosen so each launch fits one wave at 256 rows of the
// 0.5B shapes):
//   0 q/k/v:   r * (x (W * g)^T) + bias, r from the statistics `squares_in`; zeroes `squares_clear`
//   1 o:       residual + attended W^T; adds the output rows' squares into `squares_out`
//   2 gate/up: SiLU(r * gate) * (r * up) of x (W * g)^T, r from `squares_in`; zeroes `squares_clear`
//   3 down:    residual + h W^T, K split over clusters of 4; adds the output rows' squares into `squares_out`

#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <optional>
#include <string>

#define HOPPER_REQUIRE(condition, message) TORCH_CHECK((condition), "fused_product (CUDA): ", (message))
#include "fused_product_kernel.cuh"

namespace {

using fused::kNoNorm;
using fused::kNormFromStats;
using fused::kPlain;
using fused::kResidual;
using fused::kSwiglu;

const __nv_bfloat16* bf16_pointer(const torch::Tensor& tensor) {
    return reinterpret_cast<const __nv_bfloat16*>(tensor.data_ptr());
}

// A row-major bf16 matrix TMA and 16-byte stores can take: rows contiguous, the row stride the width, 16-byte aligned.
void check_matrix(const torch::Tensor& tensor, const char* name, int64_t rows, int64_t columns) {
    TORCH_CHECK(tensor.is_cuda() && tensor.scalar_type() == torch::kBFloat16 && tensor.dim() == 2,
                std::string("fused_product (CUDA): ") + name + " must be a 2-d bf16 CUDA tensor");
    TORCH_CHECK(tensor.size(0) == rows && tensor.size(1) == columns,
                std::string("fused_product (CUDA): ") + name + " must be (" + std::to_string(rows) + ", " +
                    std::to_string(columns) + "), got (" + std::to_string(tensor.size(0)) + ", " +
                    std::to_string(tensor.size(1)) + ")");
    TORCH_CHECK(tensor.stride(1) == 1 && tensor.stride(0) == columns &&
                    reinterpret_cast<uintptr_t>(tensor.data_ptr()) % 16 == 0,
                std::string("fused_product (CUDA): ") + name + " must be contiguous and 16-byte aligned");
}

float* squares_pointer(const std::optional<torch::Tensor>& squares, const char* name, int64_t rows) {
    if (!squares.has_value()) return nullptr;
    TORCH_CHECK(squares->is_cuda() && squares->scalar_type() == torch::kFloat32 && squares->dim() == 1 &&
                    squares->size(0) >= rows && squares->stride(0) == 1,
                std::string("fused_product (CUDA): ") + name + " must be a contiguous float32 vector of >= rows");
    return squares->data_ptr<float>();
}

}  // namespace

void fused_product(int64_t kind, torch::Tensor a, torch::Tensor w, torch::Tensor out, std::optional<torch::Tensor> bias,
                   std::optional<torch::Tensor> residual, std::optional<torch::Tensor> squares_in,
                   std::optional<torch::Tensor> squares_out, std::optional<torch::Tensor> squares_clear, double eps,
                   bool programmatic) {
    TORCH_CHECK(kind >= 0 && kind <= 3, "fused_product (CUDA): kind 0 (q/k/v), 1 (o), 2 (gate/up) or 3 (down)");
    const int64_t m = a.size(0), k = a.size(1), n = out.size(1);
    TORCH_CHECK(k % 64 == 0 && n % 8 == 0, "fused_product (CUDA): K a multiple of 64 and N of 8, got K " +
                                               std::to_string(k) + ", N " + std::to_string(n));
    check_matrix(a, "a", m, k);
    check_matrix(w, "w", kind == 2 ? 2 * n : n, k);
    check_matrix(out, "out", m, n);
    const bool norm = kind == 0 || kind == 2, adds_residual = kind == 1 || kind == 3;
    TORCH_CHECK(norm == squares_in.has_value(), "fused_product (CUDA): q/k/v and gate/up take squares_in, o and "
                                                "down do not");
    TORCH_CHECK(adds_residual == residual.has_value(), "fused_product (CUDA): o and down take a residual");
    TORCH_CHECK(!bias.has_value() || kind == 0, "fused_product (CUDA): only q/k/v takes a bias");
    if (residual.has_value()) check_matrix(*residual, "residual", m, n);
    if (bias.has_value())
        TORCH_CHECK(bias->is_cuda() && bias->scalar_type() == torch::kBFloat16 && bias->dim() == 1 &&
                        bias->size(0) == n && bias->stride(0) == 1,
                    "fused_product (CUDA): bias must be a contiguous bf16 vector of N");
    const fused::Arguments args{reinterpret_cast<__nv_bfloat16*>(out.data_ptr()),
                                bias.has_value() ? bf16_pointer(*bias) : nullptr,
                                residual.has_value() ? bf16_pointer(*residual) : nullptr,
                                static_cast<int>(m),
                                static_cast<int>(n),
                                static_cast<int>(k),
                                static_cast<float>(eps),
                                squares_pointer(squares_in, "squares_in", m),
                                squares_pointer(squares_out, "squares_out", m),
                                squares_pointer(squares_clear, "squares_clear", m)};
    if (m == 0) return;
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const __nv_bfloat16 *a_pointer = bf16_pointer(a), *w_pointer = bf16_pointer(w);
    switch (kind) {
        case 0: fused::launch<32, 128, 8, kPlain, kNormFromStats, 1>(a_pointer, w_pointer, args, stream, programmatic); break;
        case 1: fused::launch<32, 128, 8, kResidual, kNoNorm, 1>(a_pointer, w_pointer, args, stream, programmatic); break;
        case 2: fused::launch<80, 256, 5, kSwiglu, kNormFromStats, 1>(a_pointer, w_pointer, args, stream, programmatic); break;
        default: fused::launch<64, 128, 8, kResidual, kNoNorm, 4>(a_pointer, w_pointer, args, stream, programmatic);
    }
}
