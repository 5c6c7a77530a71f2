// How wrong is the hardware's approximate log2 (`lg2.approx`, one MUFU.LG2) just below 1? The samplers' exponential
// noise is E = -log2(u) from it (asyncrl/engine/csrc/gumbel_sample.cu, triton_sampler.py), and a race's winner
// tends to have a u next to 1, where E is tiny and an absolute error of ~2^-22 (CUDA's documented bound on
// [0.5, 2]) is a large relative one. The kernels floor E at its exact smallest value, so a 0 or a negative E cannot
// hand a token a certain win; this probe says how close to 1 the error starts to matter.
//
//   nvcc -O3 -gencode arch=compute_90,code=sm_90 -o .devbuild/log2_near_one_probe benchmarks/csrc/log2_near_one_probe.cu
//   .devbuild/log2_near_one_probe
//
// Prints, for u = 1 - j 2^-24 (j = 1..4095) and u = 1 - i 2^-16 (i = 1..4096), how many results are >= 0 and the
// worst relative error against double precision. Answer (one H200, 2026-12-04, docs/benchmarks.md round 19): no
// result is >= 0; the relative error is 86% at j = 1 (the largest u the race draws; the kernels' floor lifts it),
// 28% at j = 3, 1.2% at j = 64, 0.3% at u = 1 - 2^-16.

#include <cmath>
#include <cstdio>

#include "harness_timing.cuh"

__global__ void probe(float* out, int n) {
    const int j = threadIdx.x + blockIdx.x * blockDim.x;
    if (j >= n) return;
    const float u = j < 4096 ? 1.0f - j * 5.9604644775390625e-08f : 1.0f - (j - 4095) * 1.52587890625e-05f;
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(u));
    out[2 * j] = u;
    out[2 * j + 1] = y;
}

int main() {
    constexpr int n = 8192;
    float* device;
    CHECK_CUDA(cudaMalloc(&device, sizeof(float) * 2 * n));
    probe<<<(n + 255) / 256, 256>>>(device, n);
    static float host[2 * n];
    CHECK_CUDA(cudaMemcpy(host, device, sizeof(host), cudaMemcpyDeviceToHost));
    int non_negative = 0, first = -1;
    double worst_near = 0.0, worst_far = 0.0;
    for (int j = 1; j < n; ++j) {
        const double exact = std::log2(static_cast<double>(host[2 * j])), got = host[2 * j + 1];
        const double relative = std::fabs(got - exact) / std::fabs(exact);
        if (got >= 0.0 && first < 0) first = j;
        non_negative += got >= 0.0;
        (j < 4096 ? worst_near : worst_far) = std::fmax(j < 4096 ? worst_near : worst_far, relative);
    }
    std::printf("u = 1 - j 2^-24, j = 1..4095: %d results >= 0 (first at j = %d); worst relative error %.3e\n",
                non_negative, first, worst_near);
    std::printf("u = 1 - i 2^-16, i = 1..4096: worst relative error %.3e\n", worst_far);
    for (int j : {1, 2, 3, 4, 8, 16, 64, 256, 1024})
        std::printf("  j %5d: exact %.6e, lg2.approx %.6e\n", j, std::log2(static_cast<double>(host[2 * j])), host[2 * j + 1]);
    CHECK_CUDA(cudaFree(device));
    return 0;
}
