// What the product harnesses (wgmma_gemm_harness.cu, fused_layer_harness.cu) share: random bf16 inputs, an fp32
// reference product and the error measure of their checks.

#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <vector>

__global__ void fill_random(__nv_bfloat16* values, size_t count, uint32_t seed, float scale) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        uint32_t bits = static_cast<uint32_t>(i) * 0x9E3779B9u ^ seed;
        bits ^= bits >> 16; bits *= 0x85EBCA6Bu; bits ^= bits >> 13; bits *= 0xC2B2AE35u; bits ^= bits >> 16;
        values[i] = __float2bfloat16((static_cast<float>(bits >> 8) * 5.9604645e-08f - 0.5f) * scale);
    }
}

__global__ void reference_gemm(const __nv_bfloat16* a, const __nv_bfloat16* w, float* c, int m, int n, int k) {
    const int column = blockIdx.x * blockDim.x + threadIdx.x, row = blockIdx.y;
    if (column >= n) return;
    float sum = 0.0f;
    for (int i = 0; i < k; ++i)
        sum += __bfloat162float(a[static_cast<size_t>(row) * k + i]) * __bfloat162float(w[static_cast<size_t>(column) * k + i]);
    c[static_cast<size_t>(row) * n + column] = sum;
}

// The largest |result - expected| relative to the largest expected magnitude; a NaN (an unwritten output) is infinite.
inline double largest_error(const std::vector<__nv_bfloat16>& result, const std::vector<float>& expected, float largest) {
    double worst = 0.0;
    for (size_t i = 0; i < result.size(); ++i) {
        const double error = std::fabs(__bfloat162float(result[i]) - expected[i]) / largest;
        worst = std::isnan(error) ? INFINITY : std::fmax(worst, error);
    }
    return worst;
}
