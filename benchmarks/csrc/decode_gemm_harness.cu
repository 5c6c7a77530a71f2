// A prototype split-K GEMM for the decode step's few-row products, checked and timed without torch, to answer
// whether kernels of our own could beat cuBLAS on them before any is wired into the engine (docs/benchmarks.md,
// thirteenth round: cuBLAS's best configurations are within 1-2 us of `F.linear`, and the gap to the roofline
// is these products' fixed cost).
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -I asyncrl/engine/csrc -o .devbuild/g \
//        benchmarks/csrc/decode_gemm_harness.cu
//   .devbuild/g check     # every configuration against an fp32 reference on the device, fresh random inputs
//   .devbuild/g time      # us per product over 24 distinct weights in one CUDA graph, per configuration/split
//
// The kernel computes fp32 partial products P[s] = X[:, K_s] W[:, K_s]^T for split s of K, X (M x K) and W (N x K)
// bf16 row-major (an nn.Linear weight), M <= the tile's rows. The partials are meant to be summed by the product's
// consumer (the attention kernel for q/k/v, the residual add + norm for o and down), so the reduction costs no
// kernel of its own; `time` also reports the products with a separate reduce kernel, the honest cost until then.
// Compare with cuBLAS measured the same way (benchmarks/cublaslt_algos.py): q/k/v 4.8 us, o 4.65, gate/up 10.5,
// down 10.2 (split-K and its reduce) at 256 rows on an H200.
//
// Configurations named "C ..." sum the splits inside a thread-block cluster instead and write bf16: a drop-in
// replacement for F.linear that needs no consumer to change.
//
// Answer (H200, 2026-12-03, docs/benchmarks.md fourteenth round): no. Every configuration is correct, and every
// one is slower than cuBLAS on every shape, before any reduction (best partials: q/k/v 5.9 us, o 5.4, gate/up
// 25.1, down 11.9); the in-cluster reduction adds 2-3 us.

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "harness_timing.cuh"
#include "paged_decode_kernel.cuh"  // cp.async, ldmatrix and the 16-byte-vector swizzle of the decode kernel

using asyncrl_decode::commit_copies;
using asyncrl_decode::copy_async;
using asyncrl_decode::load_matrices;
using asyncrl_decode::wait_copies;


namespace {

constexpr int kChunk = 64;        // K elements per pipeline stage: one 128-byte line per row
constexpr int kRowVectors = 8;    // 16-byte vectors per row of a stage
constexpr int kLayers = 24;       // distinct weights per graph: weights come from HBM, as in a decode step

__device__ __forceinline__ int swizzled(int row, int vector) {
    return asyncrl_decode::swizzled(row, vector, kRowVectors);
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

struct GemmParams {
    const __nv_bfloat16* x;  // (M, K)
    const __nv_bfloat16* w;  // (N, K)
    float* partials;         // (splits, M, N), for kernels whose consumer sums the splits
    __nv_bfloat16* out;      // (M, N), for kernels that sum the splits in their cluster
    int rows, inner, outputs, splits;
};

// Padding of the fp32 tile a cluster reduces from: 8 words per row put the 8 rows of a C fragment's float2 stores
// on distinct banks.
constexpr int kTilePad = 8;

// One CTA: a BM x BN tile of split blockIdx.z. Warps WM x WN, each a (BM / WM) x (BN / WN) tile of m16n8 mma tiles.
// Stages of kChunk K-elements: X's BM rows then W's BN rows, 16-byte vectors swizzled per row (as the decode
// attention kernel's ring), read back with ldmatrix.
// With kInCluster the splits of a tile are one thread-block cluster (its z extent): each CTA leaves its fp32 tile in
// its shared memory, and rank r sums the r-th of S equal slices of every CTA's tile through distributed shared
// memory and writes it in bf16, so the product needs neither partials in device memory nor a reduce kernel.
// kMinBlocks caps registers so that many CTAs share an SM (a cluster's CTAs must be resident at once).
template <int BM, int BN, int WM, int WN, int S, bool kInCluster, int kMinBlocks>
__global__ void __launch_bounds__(WM * WN * 32, kMinBlocks) splitk_gemm(const GemmParams p) {
    constexpr int kThreads = WM * WN * 32;
    constexpr int kTileM = BM / WM, kTileN = BN / WN;  // a warp's rows and columns
    constexpr int kFragsM = kTileM / 16, kFragsN = kTileN / 8;
    static_assert(kTileM % 16 == 0 && kTileN % 16 == 0, "warp tiles of whole m16 x n16 pieces");
    constexpr int kStageVectors = (BM + BN) * kRowVectors;
    static_assert(kStageVectors % kThreads == 0, "every thread issues the same number of copies");
    extern __shared__ uint4 stages[];  // [S][BM + BN][8]

    const int tile_n = blockIdx.x * BN, tile_m = blockIdx.y * BM, split = blockIdx.z;
    const int total_chunks = p.inner / kChunk;
    const int first_chunk = split * total_chunks / p.splits;
    const int num_chunks = (split + 1) * total_chunks / p.splits - first_chunk;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int warp_m = warp / WN, warp_n = warp % WN;

    auto issue = [&](int stage, int chunk) {
        uint4* base = stages + stage * kStageVectors;
        const int64_t k0 = static_cast<int64_t>(first_chunk + chunk) * kChunk;
#pragma unroll
        for (int i = 0; i < kStageVectors / kThreads; ++i) {
            const int index = threadIdx.x + i * kThreads;
            const int row = index / kRowVectors, vector = index % kRowVectors;
            if (row < BM) {  // X rows past M are zero-filled (their address stays a valid one: row 0)
                const int m = tile_m + row;
                const bool real = m < p.rows;
                copy_async(base + swizzled(row, vector), p.x + (real ? m : 0) * static_cast<int64_t>(p.inner) + k0 + vector * 8,
                           real);
            } else {
                const int n = tile_n + row - BM;
                copy_async(base + swizzled(row, vector), p.w + n * static_cast<int64_t>(p.inner) + k0 + vector * 8, true);
            }
        }
    };

    float accumulators[kFragsM][kFragsN][4] = {};
#pragma unroll
    for (int stage = 0; stage < S - 1; ++stage) {
        if (stage < num_chunks) issue(stage, stage);
        commit_copies();
    }
    const int matrix = lane / 8, matrix_row = lane % 8;
    for (int chunk = 0; chunk < num_chunks; ++chunk) {
        wait_copies<S - 2>();
        __syncthreads();  // chunk's stage is here for every thread; the stage refilled below was read by all
        if (chunk + S - 1 < num_chunks) issue((chunk + S - 1) % S, chunk + S - 1);
        commit_copies();
        const uint4* x_tile = stages + (chunk % S) * kStageVectors;
        const uint4* w_tile = x_tile + BM * kRowVectors;
#pragma unroll
        for (int step = 0; step < kChunk / 16; ++step) {
            // A (m16 x k16): matrices (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) = a0..a3.
            uint32_t a[kFragsM][4];
#pragma unroll
            for (int i = 0; i < kFragsM; ++i) {
                const int row = warp_m * kTileM + 16 * i + 8 * (matrix % 2) + matrix_row;
                load_matrices<false>(a[i], x_tile + swizzled(row, 2 * step + matrix / 2));
            }
            // B (k16 x n8, W's rows are its columns): matrices (n 0-7, k 0-7), (0-7, 8-15), (8-15, 0-7),
            // (8-15, 8-15): b0, b1 of n-tile 2j, then of 2j + 1.
#pragma unroll
            for (int j = 0; j < kFragsN / 2; ++j) {
                uint32_t b[4];
                const int row = warp_n * kTileN + 16 * j + 8 * (matrix / 2) + matrix_row;
                load_matrices<false>(b, w_tile + swizzled(row, 2 * step + matrix % 2));
#pragma unroll
                for (int i = 0; i < kFragsM; ++i) {
                    mma_bf16(accumulators[i][2 * j], a[i], b[0], b[1]);
                    mma_bf16(accumulators[i][2 * j + 1], a[i], b[2], b[3]);
                }
            }
        }
    }
    wait_copies<0>();

    // Each lane's accumulator pairs with their row and column in the CTA's tile: rows group and group + 8,
    // columns 2 quad and 2 quad + 1 of each m16n8 tile.
    const int group = lane / 4, quad = lane % 4;
    auto for_each_pair = [&](auto&& store) {
#pragma unroll
        for (int i = 0; i < kFragsM; ++i)
#pragma unroll
            for (int j = 0; j < kFragsN; ++j)
#pragma unroll
                for (int half = 0; half < 2; ++half)
                    store(warp_m * kTileM + 16 * i + group + 8 * half, warp_n * kTileN + 8 * j + 2 * quad,
                          make_float2(accumulators[i][j][2 * half], accumulators[i][j][2 * half + 1]));
    };
    if constexpr (kInCluster) {
        namespace cg = cooperative_groups;
        cg::cluster_group cluster = cg::this_cluster();
        constexpr int kStride = BN + kTilePad;
        float* tile = reinterpret_cast<float*>(stages);
        __syncthreads();  // every warp has read its last stage: the ring becomes the fp32 tile
        for_each_pair([&](int row, int column, float2 pair) {
            *reinterpret_cast<float2*>(tile + row * kStride + column) = pair;
        });
        cluster.sync();  // every split's tile is written and visible to the cluster
        const int rank = static_cast<int>(cluster.block_rank()), size = static_cast<int>(cluster.num_blocks());
        constexpr int kVectors = BM * BN / 4;  // float4s of a tile
        const int first = rank * kVectors / size, last = (rank + 1) * kVectors / size;
        for (int vector = first + threadIdx.x; vector < last; vector += kThreads) {
            const int row = vector / (BN / 4), column = 4 * (vector % (BN / 4));
            const int m = tile_m + row;
            if (m >= p.rows) continue;
            float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            for (int r = 0; r < size; ++r) {
                const float4 part = *reinterpret_cast<const float4*>(cluster.map_shared_rank(tile, r) + row * kStride + column);
                sum.x += part.x, sum.y += part.y, sum.z += part.z, sum.w += part.w;
            }
            __nv_bfloat162* target = reinterpret_cast<__nv_bfloat162*>(p.out + static_cast<int64_t>(m) * p.outputs + tile_n + column);
            target[0] = __floats2bfloat162_rn(sum.x, sum.y);
            target[1] = __floats2bfloat162_rn(sum.z, sum.w);
        }
        cluster.sync();  // no CTA leaves while another still reads its shared memory
    } else {
        float* out = p.partials + static_cast<int64_t>(split) * p.rows * p.outputs;
        for_each_pair([&](int row, int column, float2 pair) {
            const int m = tile_m + row;
            if (m < p.rows) *reinterpret_cast<float2*>(out + static_cast<int64_t>(m) * p.outputs + tile_n + column) = pair;
        });
    }
}

// The partials summed in split order and rounded to bf16: the cost of a reduction that has no consumer to go into.
__global__ void reduce_partials(const float* partials, __nv_bfloat16* out, int64_t count, int splits) {
    for (int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; index < count;
         index += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        float sum = 0.0f;
        for (int s = 0; s < splits; ++s) sum += partials[s * count + index];
        out[index] = __float2bfloat16(sum);
    }
}

__global__ void reference_gemm(const __nv_bfloat16* x, const __nv_bfloat16* w, float* out, int rows, int inner,
                               int outputs) {
    const int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (index >= static_cast<int64_t>(rows) * outputs) return;
    const int m = static_cast<int>(index / outputs), n = static_cast<int>(index % outputs);
    float sum = 0.0f;
    for (int k = 0; k < inner; ++k)
        sum += __bfloat162float(x[static_cast<int64_t>(m) * inner + k]) * __bfloat162float(w[static_cast<int64_t>(n) * inner + k]);
    out[index] = sum;
}

__global__ void fill_random(__nv_bfloat16* data, int64_t count, uint64_t seed, float scale) {
    for (int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; index < count;
         index += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        uint64_t z = seed + static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull;  // splitmix64
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        const float a = static_cast<float>(z & 0xFFFFFF) / 16777216.0f, b = static_cast<float>((z >> 24) & 0xFFFFFF) / 16777216.0f;
        data[index] = __float2bfloat16((a + b - 1.0f) * scale);
    }
}

struct Config {
    const char* name;
    int bm, bn;
    bool in_cluster;  // writes bf16 itself; otherwise fp32 partials
    cudaError_t (*launch)(const GemmParams&, cudaStream_t);
};

template <int BM, int BN, int WM, int WN, int S, bool kInCluster, int kMinBlocks = 1>
cudaError_t launch(const GemmParams& p, cudaStream_t stream) {
    constexpr int kRing = S * (BM + BN) * kRowVectors * 16;
    constexpr int kTile = kInCluster ? BM * (BN + kTilePad) * 4 : 0;
    constexpr int kBytes = kRing > kTile ? kRing : kTile;
    auto* kernel = splitk_gemm<BM, BN, WM, WN, S, kInCluster, kMinBlocks>;
    static const cudaError_t prepared = [&] {
        cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
        if (status == cudaSuccess && kInCluster)
            status = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        return status;
    }();
    if (prepared != cudaSuccess) return prepared;
    if (p.outputs % BN != 0 || p.inner % kChunk != 0 || p.splits > p.inner / kChunk) return cudaErrorInvalidValue;
    if (kInCluster && p.splits > 16) return cudaErrorInvalidValue;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(p.outputs / BN, (p.rows + BM - 1) / BM, p.splits);
    config.blockDim = dim3(WM * WN * 32);
    config.dynamicSmemBytes = kBytes;
    config.stream = stream;
    cudaLaunchAttribute cluster = {};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = 1, cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = p.splits;
    config.attrs = &cluster;
    config.numAttrs = kInCluster ? 1 : 0;
    return cudaLaunchKernelEx(&config, kernel, p);
}

const Config kConfigs[] = {
    {"256x64 w4x2 s3", 256, 64, false, launch<256, 64, 4, 2, 3, false>},
    {"256x64 w4x2 s4", 256, 64, false, launch<256, 64, 4, 2, 4, false>},
    {"128x64 w2x2 s4", 128, 64, false, launch<128, 64, 2, 2, 4, false>},
    {"256x128 w4x2 s3", 256, 128, false, launch<256, 128, 4, 2, 3, false>},
    {"128x128 w2x4 s3", 128, 128, false, launch<128, 128, 2, 4, 3, false>},
    {"C 256x64 w4x2 s2", 256, 64, true, launch<256, 64, 4, 2, 2, true>},
    {"C 256x64 w4x2 s2 b2", 256, 64, true, launch<256, 64, 4, 2, 2, true, 2>},
    {"C 256x64 w4x2 s3 b2", 256, 64, true, launch<256, 64, 4, 2, 3, true, 2>},
    {"C 128x64 w2x2 s3", 128, 64, true, launch<128, 64, 2, 2, 3, true>},
    {"C 128x64 w2x2 s3 b3", 128, 64, true, launch<128, 64, 2, 2, 3, true, 3>},
    {"C 128x64 w4x1 s4 b2", 128, 64, true, launch<128, 64, 4, 1, 4, true, 2>},
    {"C 256x128 w4x2 s2", 256, 128, true, launch<256, 128, 4, 2, 2, true>},
    {"C 128x128 w2x4 s3 b2", 128, 128, true, launch<128, 128, 2, 4, 3, true, 2>},
};

struct Shape {
    const char* name;
    int inner, outputs;
};
// Qwen2.5-0.5B's decode products (q/k/v and gate/up fused, as the engine runs them).
const Shape kShapes[] = {{"qkv", 896, 1152}, {"o", 896, 896}, {"gate_up", 896, 9728}, {"down", 4864, 896}};

template <typename T>
T* allocate(int64_t count) {
    T* device = nullptr;
    CHECK_CUDA(cudaMalloc(&device, count * sizeof(T)));
    return device;
}

std::vector<float> download(const float* device, int64_t count) {
    std::vector<float> host(count);
    CHECK_CUDA(cudaMemcpy(host.data(), device, count * sizeof(float), cudaMemcpyDeviceToHost));
    return host;
}

std::vector<float> download(const __nv_bfloat16* device, int64_t count) {
    std::vector<__nv_bfloat16> raw(count);
    CHECK_CUDA(cudaMemcpy(raw.data(), device, count * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
    std::vector<float> host(count);
    for (int64_t i = 0; i < count; ++i) host[i] = __bfloat162float(raw[i]);
    return host;
}

// What a configuration's launch produced, summed over splits where it wrote partials.
std::vector<float> result(const Config& config, const GemmParams& params) {
    const int64_t count = static_cast<int64_t>(params.rows) * params.outputs;
    if (config.in_cluster) return download(params.out, count);
    const std::vector<float> got = download(params.partials, params.splits * count);
    std::vector<float> sums(count, 0.0f);
    for (int64_t i = 0; i < count; ++i)
        for (int s = 0; s < params.splits; ++s) sums[i] += got[s * count + i];
    return sums;
}

// Every configuration and a few split counts on fresh random inputs against the fp32 reference. Partials must
// sum to it within fp32 rounding (1e-4 relative; the products of bf16 inputs are exact in fp32), a cluster's bf16
// output within bf16 rounding (4e-3). Every element must be written: the outputs are poisoned with NaN first.
bool check() {
    bool passed = true;
    uint64_t seed = 1;
    for (const Shape& shape : kShapes)
        for (int rows : {256, 200, 1}) {
            const int64_t x_count = static_cast<int64_t>(rows) * shape.inner, w_count = static_cast<int64_t>(shape.outputs) * shape.inner;
            const int64_t out_count = static_cast<int64_t>(rows) * shape.outputs;
            auto* x = allocate<__nv_bfloat16>(x_count);
            auto* w = allocate<__nv_bfloat16>(w_count);
            auto* reference = allocate<float>(out_count);
            const int max_splits = 8;
            auto* partials = allocate<float>(max_splits * out_count);
            auto* out = allocate<__nv_bfloat16>(out_count);
            fill_random<<<256, 256>>>(x, x_count, seed++, 2.0f);
            fill_random<<<256, 256>>>(w, w_count, seed++, 0.05f);
            reference_gemm<<<(out_count + 255) / 256, 256>>>(x, w, reference, rows, shape.inner, shape.outputs);
            CHECK_CUDA(cudaGetLastError());
            const std::vector<float> expected = download(reference, out_count);
            for (const Config& config : kConfigs)
                for (int splits : {1, 3, 7, 8}) {
                    CHECK_CUDA(cudaMemset(partials, 0xFF, max_splits * out_count * sizeof(float)));  // NaN
                    CHECK_CUDA(cudaMemset(out, 0xFF, out_count * sizeof(__nv_bfloat16)));
                    const GemmParams params{x, w, partials, out, rows, shape.inner, shape.outputs, splits};
                    CHECK_CUDA(config.launch(params, nullptr));
                    CHECK_CUDA(cudaDeviceSynchronize());
                    const std::vector<float> got = result(config, params);
                    double error = 0.0, norm = 0.0;
                    bool finite = true;
                    for (int64_t i = 0; i < out_count; ++i) {
                        finite &= std::isfinite(got[i]);
                        error += (got[i] - expected[i]) * static_cast<double>(got[i] - expected[i]);
                        norm += static_cast<double>(expected[i]) * expected[i];
                    }
                    const double relative = std::sqrt(error / norm);
                    const bool ok = finite && relative < (config.in_cluster ? 4e-3 : 1e-4);
                    passed &= ok;
                    std::printf("check %-8s rows %3d %-18s splits %d: relative error %.2e%s\n", shape.name, rows,
                                config.name, splits, relative, ok ? "" : (finite ? "  FAILED" : "  FAILED (unwritten)"));
                }
            CHECK_CUDA(cudaFree(x));
            CHECK_CUDA(cudaFree(w));
            CHECK_CUDA(cudaFree(reference));
            CHECK_CUDA(cudaFree(partials));
            CHECK_CUDA(cudaFree(out));
        }
    std::printf(passed ? "check passed\n" : "check FAILED\n");
    return passed;
}

// Median us per product of kLayers launches (distinct weights) replayed from one CUDA graph, with or without a
// reduce kernel after each.
double time_config(const Config& config, const Shape& shape, int rows, int splits, bool reduce, __nv_bfloat16* x,
                   const std::vector<__nv_bfloat16*>& weights, float* partials, __nv_bfloat16* out) {
    const GemmParams probe{x, weights[0], partials, out, rows, shape.inner, shape.outputs, splits};
    if (config.launch(probe, nullptr) != cudaSuccess) return -1.0;  // a configuration that does not fit the shape
    CHECK_CUDA(cudaDeviceSynchronize());
    const int64_t out_count = static_cast<int64_t>(rows) * shape.outputs;
    const double milliseconds = graph_median_ms(
        [&](cudaStream_t stream) {
            for (__nv_bfloat16* w : weights) {
                const GemmParams params{x, w, partials, out, rows, shape.inner, shape.outputs, splits};
                CHECK_CUDA(config.launch(params, stream));
                if (reduce && !config.in_cluster) reduce_partials<<<264, 256, 0, stream>>>(partials, out, out_count, splits);
            }
        },
        30);
    return milliseconds * 1e3 / kLayers;
}

void time_all(int rows) {
    for (const Shape& shape : kShapes) {
        auto* x = allocate<__nv_bfloat16>(static_cast<int64_t>(rows) * shape.inner);
        fill_random<<<256, 256>>>(x, static_cast<int64_t>(rows) * shape.inner, 11, 2.0f);
        std::vector<__nv_bfloat16*> weights;
        for (int layer = 0; layer < kLayers; ++layer) {
            weights.push_back(allocate<__nv_bfloat16>(static_cast<int64_t>(shape.outputs) * shape.inner));
            fill_random<<<256, 256>>>(weights.back(), static_cast<int64_t>(shape.outputs) * shape.inner, 100 + layer, 0.05f);
        }
        const int max_splits = 18;
        auto* partials = allocate<float>(max_splits * static_cast<int64_t>(rows) * shape.outputs);
        auto* out = allocate<__nv_bfloat16>(static_cast<int64_t>(rows) * shape.outputs);
        CHECK_CUDA(cudaDeviceSynchronize());
        const double floor_us = std::max(2.0 * shape.inner * shape.outputs / 4.3e12,
                                         2.0 * rows * shape.inner * shape.outputs / 790e12) * 1e6;
        std::printf("%s (M %d, K %d, N %d; floor %.1f us at 4.3 TB/s and 790 TFLOP/s)\n", shape.name, rows,
                    shape.inner, shape.outputs, floor_us);
        for (const Config& config : kConfigs) {
            const int tiles = (shape.outputs / config.bn) * ((rows + config.bm - 1) / config.bm);
            for (int splits : {1, 2, 3, 4, 6, 7, 8, 9, 12, 14, 16, 18}) {
                if (splits > shape.inner / kChunk || tiles * splits > 4 * 132) continue;
                const double alone = time_config(config, shape, rows, splits, false, x, weights, partials, out);
                if (alone < 0) continue;
                if (config.in_cluster) {
                    std::printf("  %-18s splits %2d (%3d CTAs): %6.2f us, bf16 out\n", config.name, splits,
                                tiles * splits, alone);
                    continue;
                }
                const double reduced = time_config(config, shape, rows, splits, true, x, weights, partials, out);
                std::printf("  %-18s splits %2d (%3d CTAs): %6.2f us, %6.2f us with a reduce kernel\n", config.name,
                            splits, tiles * splits, alone, reduced);
            }
        }
        CHECK_CUDA(cudaFree(x));
        for (auto* w : weights) CHECK_CUDA(cudaFree(w));
        CHECK_CUDA(cudaFree(partials));
        CHECK_CUDA(cudaFree(out));
    }
}

}  // namespace

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "check";
    if (mode == "check") return check() ? 0 : 1;
    if (mode == "time") {
        time_all(argc > 2 ? std::atoi(argv[2]) : 256);
        return 0;
    }
    std::fprintf(stderr, "usage: %s check | time [rows]\n", argv[0]);
    return 2;
}
