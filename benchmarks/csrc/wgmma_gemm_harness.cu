// Prototype GEMMs for the decode step's products at 256 rows on Hopper's `wgmma`, checked and timed without torch:
// C (M, N) bf16 = A (M, K) bf16 x W (N, K)^T, fp32 accumulation. The question: does a `wgmma` kernel tiled for 256
// rows (a column tile sized so the grid is one wave of 132 SMs) beat cuBLAS on these shapes, where round 14's
// `mma.sync` kernel reached only ~180 TFLOP/s on gate/up?
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I benchmarks/csrc -I asyncrl/engine/csrc \
//        -o .devbuild/wgmma_gemm_harness benchmarks/csrc/wgmma_gemm_harness.cu
//   .devbuild/wgmma_gemm_harness check   # every configuration against an fp32 reference on the device (SwiGLU too)
//   .devbuild/wgmma_gemm_harness time    # us per product over 24 distinct weights in one CUDA graph
//
// Two kernels, both with BM rows (128 or 256: one consumer warpgroup of 128 threads per 128 rows, two m64 products
// each) x BN columns per CTA and K in blocks of 64 (128 bytes of bf16, the 128-byte swizzle's row). Shared tiles
// are laid out as a 128-byte-swizzle TMA box (row r's 16-byte chunk c at chunk c ^ (r % 8), tiles 1024-byte
// aligned), so `wgmma` reads both operands K-major through shared-memory descriptors; a k16 step advances a
// descriptor's start by 32 bytes. Those building blocks are in asyncrl/engine/csrc/hopper_gemm_primitives.cuh.
// - `wgmma_gemm`: every thread loads with cp.async (zero fill past N), STAGES blocks in flight, a CTA barrier per
//   block before a stage is refilled.
// - `tma_gemm`: a producer warpgroup (one thread issues the copies) and full/empty mbarriers per stage; with CS > 1
//   the CTAs of a cluster of CS along N each load a slice of the A tile and multicast it to all of them; with
//   a staged EPILOGUE the output tile goes through shared memory and leaves in 16-byte row chunks, optionally as
//   SiLU(gate) x up of a tile whose B rows are half gate, half up (`check` and `time` cover it as "SwiGLU").
//
// Answer (one H200, 2026-12-04, docs/benchmarks.md sixteenth round): all correct. With the staged epilogue the TMA
// kernel matches cuBLAS on gate/up (10.7 us, BN 80, BM 256; cuBLAS 10.8) and comes within 0.3-0.7 us on q/k/v and
// o (5.5 us, BN 32, BM 128; cuBLAS 5.3 and 4.8). The epilogue written straight from the accumulator layout cost
// ~5.5 us of gate/up's 13.6; staged, ~3 us. Multicast clusters did not help (7-36 us; 12.2 us staged). SiLU x up
// in gate/up's epilogue: 13.3 us against 10.8 + ~3.2 us for the two kernels it would replace.

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "harness_timing.cuh"
#include "gemm_check.cuh"
#include "hopper_gemm_primitives.cuh"

// FENCE: the proxy fence between cp.async's writes and wgmma's reads (the PTX model asks for it; `nofence` times
// what it costs). IN_FLIGHT: wgmma groups left running across the next block's barrier (0 or 1); a stage is
// refilled once the group that read it is done, so loads run STAGES - 1 - IN_FLIGHT blocks ahead.
template <int BN, int BM, int STAGES, bool FENCE, int IN_FLIGHT>
__global__ void __launch_bounds__(BM) wgmma_gemm(const __nv_bfloat16* __restrict__ a,
                                                  const __nv_bfloat16* __restrict__ w, __nv_bfloat16* __restrict__ c,
                                                  int m, int n, int k) {
    constexpr int kABytes = BM * 128, kBBytes = BN * 128, kStageBytes = kABytes + kBBytes;
    static_assert(kBBytes % 1024 == 0, "each tile starts on a 1024-byte swizzle boundary");
    extern __shared__ unsigned char shared_raw[];
    const uint32_t base = (shared_address(shared_raw) + 1023) & ~1023u;
    const int thread = threadIdx.x, warpgroup = thread / 128;
    const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM, num_blocks = k / 64;

    auto load_stage = [&](int stage, int block) {
        const uint32_t tile_a = base + stage * kStageBytes, tile_b = tile_a + kABytes;
#pragma unroll
        for (int i = thread; i < BM * 8; i += BM) {
            const int row = i >> 3, chunk = i & 7;
            const bool valid = m0 + row < m;
            copy_16(tile_a + row * 128 + ((chunk ^ (row & 7)) << 4),
                    a + static_cast<size_t>(valid ? m0 + row : 0) * k + block * 64 + chunk * 8, valid);
        }
#pragma unroll
        for (int i = thread; i < BN * 8; i += BM) {
            const int row = i >> 3, chunk = i & 7;
            const bool valid = n0 + row < n;
            copy_16(tile_b + row * 128 + ((chunk ^ (row & 7)) << 4),
                    w + static_cast<size_t>(valid ? n0 + row : 0) * k + block * 64 + chunk * 8, valid);
        }
    };

    float accumulators[2][BN / 2] = {};

    constexpr int kAhead = STAGES - 1 - IN_FLIGHT;
    static_assert(kAhead >= 1, "at least one block loaded ahead");
#pragma unroll
    for (int stage = 0; stage < kAhead; ++stage) {
        if (stage < num_blocks) load_stage(stage, stage);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int block = 0; block < num_blocks; ++block) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(kAhead - 1));
        if constexpr (FENCE) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        const int next = block + kAhead;  // its stage was read by a group every warpgroup has finished
        if (next < num_blocks) load_stage(next % STAGES, next);
        asm volatile("cp.async.commit_group;\n" ::);
        const uint32_t tile_a = base + (block % STAGES) * kStageBytes, tile_b = tile_a + kABytes;
        multiply_block<BN>(accumulators, tile_a, tile_b, warpgroup);
        asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(IN_FLIGHT) : "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");

    store_accumulators<BN>(accumulators, c, m, n, m0 + warpgroup * 128, n0);
}

// The same product fed by the tensor-memory accelerator: one producer warpgroup (one thread of it issues the
// copies) and BM / 128 consumer warpgroups, full/empty mbarriers per stage, the 128-byte swizzle written by TMA.
// A consumer releases a stage once the wgmma group that read it is done (IN_FLIGHT groups may stay running).

// The epilogues: bf16 pairs stored straight from the accumulator layout; the tile staged through shared memory
// and stored in 16-byte row chunks; staged, with SiLU(gate) x up computed first (the B tile's first BN / 2 rows are
// gate rows, the rest the matching up rows, so a thread holds both halves of its outputs).
constexpr int kDirect = 0, kStaged = 1, kStagedSwiglu = 2;

// A consumer warpgroup: its 128 rows of the CTA's tile, block by block as the stages fill, then the epilogue.
template <int BN, int BM, int STAGES, int IN_FLIGHT, int CS, int PART, int EPILOGUE>
__device__ __forceinline__ void consume(uint32_t base, uint32_t full, uint32_t empty, __nv_bfloat16* __restrict__ c,
                                        int m, int n, int k, int m0, int n0, int num_blocks) {
    constexpr int kABytes = BM * 128, kStageBytes = kABytes + BN * 128;
    const int thread = threadIdx.x, warpgroup = thread / 128;
    float accumulators[2][BN / 2] = {};
    for (int block = 0; block < num_blocks; ++block) {
        const int stage = block % STAGES;
        barrier_wait(full + stage * 8, (block / STAGES) & 1);
        const uint32_t tile_a = base + stage * kStageBytes, tile_b = tile_a + kABytes;
        if constexpr (PART != 1) {
            multiply_block<BN>(accumulators, tile_a, tile_b, warpgroup);
            asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(IN_FLIGHT) : "memory");
        }
        const int done = block - IN_FLIGHT;  // the block whose group has finished: its stage is free
        if (done >= 0 && thread % 128 == 0) {
            const uint32_t barrier = empty + (done % STAGES) * 8;
            if constexpr (CS > 1) {
#pragma unroll
                for (int target = 0; target < CS; ++target) {
                    uint32_t remote;
                    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(barrier), "r"(target));
                    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote)
                                 : "memory");
                }
            } else {
                asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(barrier) : "memory");
            }
        }
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");

    // The epilogue goes through shared memory: each warpgroup writes its 128 x BN tile there (rows padded by 16
    // bytes, so the accumulator layout's 4-byte writes hit 32 distinct banks), then stores whole 16-byte chunks of
    // each row. Written straight from the accumulator layout, 4-byte stores of 8 rows at a time, it cost ~5.5 us of
    // a 7.6 us single-block launch on gate/up (this harness, PART 1 and 2 at K 64).
    if constexpr (EPILOGUE != kDirect) {
        constexpr int kColumns = EPILOGUE == kStagedSwiglu ? BN / 2 : BN;
        constexpr int kPitch = staged_pitch_words(kColumns) * 4;
        static_assert(BM * kPitch <= STAGES * kStageBytes, "the staged tile fits in the ring");
        // Every consumer is past its last block (a slower warpgroup may still read the ring), then the ring is free.
        asm volatile("bar.sync 1, %0;\n" ::"n"(BM) : "memory");
        const uint32_t staged = base + warpgroup * 128 * kPitch;
        const int warp = (thread % 128) / 32, lane = thread % 32, g = lane / 4, q = lane % 4;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int row = half * 64 + warp * 16 + g;
#pragma unroll
            for (int j = 0; j < kColumns / 8; ++j) {
                float values[4];
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    values[r] = accumulators[half][j * 4 + r];
                    if constexpr (EPILOGUE == kStagedSwiglu) {  // both rounded to bf16 first, as the product's output
                        const float gate = __bfloat162float(__float2bfloat16(values[r]));
                        const float up = __bfloat162float(__float2bfloat16(accumulators[half][(j + BN / 16) * 4 + r]));
                        values[r] = gate / (1.0f + __expf(-gate)) * up;
                    }
                }
                const __nv_bfloat162 top = __floats2bfloat162_rn(values[0], values[1]);
                const __nv_bfloat162 bottom = __floats2bfloat162_rn(values[2], values[3]);
                const uint32_t address = staged + row * kPitch + (j * 8 + q * 2) * 2;
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address), "r"(*reinterpret_cast<const uint32_t*>(&top)));
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address + 8 * kPitch),
                             "r"(*reinterpret_cast<const uint32_t*>(&bottom)));
            }
        }
        asm volatile("bar.sync %0, 128;\n" ::"r"(2 + warpgroup) : "memory");  // this warpgroup's tile is staged
        constexpr int kChunks = kColumns / 8;  // 16-byte chunks per row
        for (int index = thread % 128; index < 128 * kChunks; index += 128) {
            const int row = index / kChunks, chunk = index % kChunks;
            const int global_row = m0 + warpgroup * 128 + row, column = n0 + chunk * 8;
            if (global_row >= m || column >= n) continue;
            uint4 value;
            asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(value.x), "=r"(value.y), "=r"(value.z), "=r"(value.w)
                         : "r"(staged + row * kPitch + chunk * 16));
            *reinterpret_cast<uint4*>(c + static_cast<size_t>(global_row) * n + column) = value;
        }
        return;
    }
    store_accumulators<BN>(accumulators, c, m, n, m0 + warpgroup * 128, n0);
}

// PART: 0 the product; 1 the loads alone (consumers release stages unread); 2 the products alone (no copies, the
// stages' stale contents multiplied); 4 the launch alone (the barriers initialised, nothing else). 1, 2 and 4
// only split the time; their outputs are not the product. (Products without the epilogue's stores cannot be timed:
// ptxas drops the wgmmas whose results are unused.)
template <int BN, int BM, int STAGES, int IN_FLIGHT, int CS, int PART = 0, int EPILOGUE = kDirect>
__global__ void __launch_bounds__(BM + 128) tma_gemm(const __grid_constant__ CUtensorMap map_a,
                                                    const __grid_constant__ CUtensorMap map_w,
                                                    __nv_bfloat16* __restrict__ c, int m, int n, int k) {
    constexpr int kABytes = BM * 128, kBBytes = BN * 128, kStageBytes = kABytes + kBBytes;
    constexpr int kConsumers = BM / 128;
    static_assert(kBBytes % 1024 == 0 && (BM / CS) % 8 == 0 && (EPILOGUE != kStagedSwiglu || BN % 16 == 0),
                  "each tile, slice and gate/up half on a 1024-byte swizzle boundary");
    extern __shared__ unsigned char shared_raw[];
    const uint32_t base = (shared_address(shared_raw) + 1023) & ~1023u;
    const uint32_t full = base + STAGES * kStageBytes, empty = full + STAGES * 8;
    const int thread = threadIdx.x, warpgroup = thread / 128;
    // With the SwiGLU epilogue n is the output's width (the weight has 2 n rows: gate, then up) and a CTA's tile
    // covers BN / 2 output columns.
    const int n0 = blockIdx.x * (EPILOGUE == kStagedSwiglu ? BN / 2 : BN), m0 = blockIdx.y * BM, num_blocks = k / 64;
    uint32_t rank = 0;
    if constexpr (CS > 1) asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    if (thread == 0) {
        for (int stage = 0; stage < STAGES; ++stage) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(full + stage * 8));
            // Every consumer warpgroup of the cluster frees a stage: this CTA's multicast writes into all of them.
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(empty + stage * 8), "r"(kConsumers * CS));
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if constexpr (CS > 1) {  // every CTA's barriers exist before any multicast or remote arrive reaches them
        asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
    }

    if constexpr (PART == 4) return;
    if (warpgroup == kConsumers) {  // the producer
        if (thread % 128 == 0) {
            for (int block = 0; block < num_blocks; ++block) {
                const int stage = block % STAGES;
                if (block >= STAGES) barrier_wait(empty + stage * 8, ((block / STAGES) & 1) ^ 1);
                const uint32_t tile_a = base + stage * kStageBytes;
                if constexpr (PART == 2) {
                    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(full + stage * 8) : "memory");
                    continue;
                }
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(full + stage * 8),
                             "r"(kStageBytes)
                             : "memory");
                if constexpr (CS > 1) {  // this CTA's slice of the A tile, to every CTA of the cluster
                    const uint32_t slice = rank * (BM / CS);
                    asm volatile(
                        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                        " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(tile_a + slice * 128),
                        "l"(reinterpret_cast<uint64_t>(&map_a)), "r"(block * 64), "r"(m0 + static_cast<int>(slice)),
                        "r"(full + stage * 8), "h"(static_cast<uint16_t>((1 << CS) - 1))
                        : "memory");
                } else {
                    tma_load_2d(tile_a, &map_a, block * 64, m0, full + stage * 8);
                }
                if constexpr (EPILOGUE == kStagedSwiglu) {
                    tma_load_2d(tile_a + kABytes, &map_w, block * 64, n0, full + stage * 8);
                    tma_load_2d(tile_a + kABytes + BN / 2 * 128, &map_w, block * 64, n + n0, full + stage * 8);
                } else {
                    tma_load_2d(tile_a + kABytes, &map_w, block * 64, n0, full + stage * 8);
                }
            }
        }
    } else {
        consume<BN, BM, STAGES, IN_FLIGHT, CS, PART, EPILOGUE>(base, full, empty, c, m, n, k, m0, n0, num_blocks);
    }
    if constexpr (CS > 1) {  // no CTA leaves while another may still arrive on its barriers
        asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
    }
}

template <int BN, int BM, int STAGES, int IN_FLIGHT, int CS = 1, int PART = 0, int EPILOGUE = kDirect>
void launch_tma(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, int m, int n, int k,
                cudaStream_t stream) {
    constexpr int kShared = STAGES * (BM + BN) * 128 + 1024 + STAGES * 16;
    auto kernel = tma_gemm<BN, BM, STAGES, IN_FLIGHT, CS, PART, EPILOGUE>;
    static bool configured = false;
    if (!configured) {
        CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kShared));
        if (CS > 1) CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
        configured = true;
    }
    constexpr bool kSwiglu = EPILOGUE == kStagedSwiglu;
    const CUtensorMap map_a = tensor_map(a, m, k, BM / CS),
                      map_w = tensor_map(w, kSwiglu ? 2 * n : n, k, kSwiglu ? BN / 2 : BN);
    const int tile_columns = kSwiglu ? BN / 2 : BN, column_tiles = (n + tile_columns - 1) / tile_columns;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3((column_tiles + CS - 1) / CS * CS, (m + BM - 1) / BM);  // whole clusters: spare CTAs
    config.blockDim = dim3(BM + 128);                                              // compute zeros, store nothing
    config.dynamicSmemBytes = kShared;
    config.stream = stream;
    cudaLaunchAttribute attribute;
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = CS;
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    CHECK_CUDA(cudaLaunchKernelEx(&config, kernel, map_a, map_w, c, m, n, k));
}

struct Config {
    const char* name;
    void (*launch)(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int, int, int, cudaStream_t);
    bool timing_only = false;  // a part of a product (PART 1 or 2): timed, not checked
};

template <int BN, int BM, int STAGES, bool FENCE = true, int IN_FLIGHT = 0>
void launch_gemm(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, int m, int n, int k,
                 cudaStream_t stream) {
    constexpr int kShared = STAGES * (BM + BN) * 128 + 1024;
    static bool configured = false;
    if (!configured) {
        CHECK_CUDA(cudaFuncSetAttribute(wgmma_gemm<BN, BM, STAGES, FENCE, IN_FLIGHT>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        kShared));
        configured = true;
    }
    const dim3 grid((n + BN - 1) / BN, (m + BM - 1) / BM);
    wgmma_gemm<BN, BM, STAGES, FENCE, IN_FLIGHT><<<grid, BM, kShared, stream>>>(a, w, c, m, n, k);
    CHECK_CUDA(cudaGetLastError());
}

const Config kConfigs[] = {
    {"cp.async BN 80, BM 256, 5 st, 1 fly", launch_gemm<80, 256, 5, true, 1>},
    {"TMA BN 80, BM 256, 5 st, 1 fly", launch_tma<80, 256, 5, 1>},
    {"  its loads alone", launch_tma<80, 256, 5, 1, 1, 1>, true},
    {"  its products alone", launch_tma<80, 256, 5, 1, 1, 2>, true},
    {"  its launch alone", launch_tma<80, 256, 5, 1, 1, 4>, true},
    {"  staged epilogue", launch_tma<80, 256, 5, 1, 1, 0, kStaged>},
    {"  staged epilogue, loads alone", launch_tma<80, 256, 5, 1, 1, 1, kStaged>, true},
    {"TMA BN 128, BM 256, 4 st, 1 fly, staged", launch_tma<128, 256, 4, 1, 1, 0, kStaged>},
    {"TMA BN 64, BM 256, 5 st, 1 fly, staged", launch_tma<64, 256, 5, 1, 1, 0, kStaged>},
    {"TMA BN 96, BM 256, 5 st, 1 fly, staged", launch_tma<96, 256, 5, 1, 1, 0, kStaged>},
    {"TMA BN 64, BM 128, 8 st, 1 fly", launch_tma<64, 128, 8, 1>},
    {"  staged epilogue", launch_tma<64, 128, 8, 1, 1, 0, kStaged>},
    {"TMA BN 32, BM 128, 8 st, 1 fly, staged", launch_tma<32, 128, 8, 1, 1, 0, kStaged>},
    {"TMA BN 80, BM 128, 8 st, 1 fly, staged", launch_tma<80, 128, 8, 1, 1, 0, kStaged>},
    {"TMA BN 64, BM 128, 8 st, 1 fly, CS 2, staged", launch_tma<64, 128, 8, 1, 2, 0, kStaged>},
    {"TMA BN 80, BM 256, 5 st, 1 fly, CS 2, staged", launch_tma<80, 256, 5, 1, 2, 0, kStaged>},
};

struct Shape {
    const char* name;
    int n, k;
};
// "K 64": gate/up with one block of K, the kernel's cost before and after its loop (launch, first copies, epilogue).
const Shape kShapes[] = {{"gate/up", 9728, 896}, {"q/k/v", 1152, 896}, {"o", 896, 896}, {"K 64", 9728, 64}};

// One configuration's launch into NaN-poisoned c, read back and compared with `expected`; prints a line.
bool check_launch(const Config& config, const char* label, const __nv_bfloat16* a, const __nv_bfloat16* w,
                  __nv_bfloat16* c, int m, int n, int k, const std::vector<float>& expected, float largest) {
    CHECK_CUDA(cudaMemset(c, 0xFF, sizeof(__nv_bfloat16) * expected.size()));  // NaN: an unwritten output shows
    config.launch(a, w, c, m, n, k, 0);
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<__nv_bfloat16> result(expected.size());
    CHECK_CUDA(cudaMemcpy(result.data(), c, sizeof(__nv_bfloat16) * result.size(), cudaMemcpyDeviceToHost));
    const double worst = largest_error(result, expected, largest);
    const bool ok = worst < 1e-2;
    std::printf("check %-8s %-40s largest error %.2e of the largest output: %s\n", label, config.name, worst,
                ok ? "ok" : "WRONG");
    return ok;
}

int check() {
    const int m = 256;
    bool all_ok = true;
    for (const Shape& shape : kShapes) {
        __nv_bfloat16 *a, *w, *c;
        float* reference;
        CHECK_CUDA(cudaMalloc(&a, sizeof(__nv_bfloat16) * m * shape.k));
        CHECK_CUDA(cudaMalloc(&w, sizeof(__nv_bfloat16) * shape.n * shape.k));
        CHECK_CUDA(cudaMalloc(&c, sizeof(__nv_bfloat16) * m * shape.n));
        CHECK_CUDA(cudaMalloc(&reference, sizeof(float) * m * shape.n));
        fill_random<<<512, 256>>>(a, static_cast<size_t>(m) * shape.k, 1, 2.0f);
        fill_random<<<512, 256>>>(w, static_cast<size_t>(shape.n) * shape.k, 2, 0.1f);
        reference_gemm<<<dim3((shape.n + 127) / 128, m), 128>>>(a, w, reference, m, shape.n, shape.k);
        CHECK_CUDA(cudaDeviceSynchronize());
        std::vector<float> expected(static_cast<size_t>(m) * shape.n);
        CHECK_CUDA(cudaMemcpy(expected.data(), reference, sizeof(float) * expected.size(), cudaMemcpyDeviceToHost));
        float largest = 0.0f;
        for (float value : expected) largest = std::fmax(largest, std::fabs(value));
        for (const Config& config : kConfigs)
            if (!config.timing_only)
                all_ok = check_launch(config, shape.name, a, w, c, m, shape.n, shape.k, expected, largest) && all_ok;
        CHECK_CUDA(cudaFree(a));
        CHECK_CUDA(cudaFree(w));
        CHECK_CUDA(cudaFree(c));
        CHECK_CUDA(cudaFree(reference));
    }
    return all_ok ? 0 : 1;
}

void time_all() {
    const int m = 256, layers = 24;
    for (const Shape& shape : kShapes) {
        __nv_bfloat16 *a, *w, *c;
        CHECK_CUDA(cudaMalloc(&a, sizeof(__nv_bfloat16) * m * shape.k));
        CHECK_CUDA(cudaMalloc(&w, sizeof(__nv_bfloat16) * layers * shape.n * shape.k));
        CHECK_CUDA(cudaMalloc(&c, sizeof(__nv_bfloat16) * layers * m * shape.n));
        fill_random<<<512, 256>>>(a, static_cast<size_t>(m) * shape.k, 1, 2.0f);
        fill_random<<<512, 256>>>(w, static_cast<size_t>(layers) * shape.n * shape.k, 2, 0.1f);
        CHECK_CUDA(cudaDeviceSynchronize());
        const double flops = 2.0 * m * shape.n * shape.k;
        for (const Config& config : kConfigs) {
            const double milliseconds = graph_median_ms(
                [&](cudaStream_t stream) {
                    for (int layer = 0; layer < layers; ++layer)
                        config.launch(a, w + static_cast<size_t>(layer) * shape.n * shape.k,
                                      c + static_cast<size_t>(layer) * m * shape.n, m, shape.n, shape.k, stream);
                },
                20);
            const double microseconds = milliseconds * 1e3 / layers;
            std::printf("time %-8s %-40s %6.2f us per product, %4.0f TFLOP/s\n", shape.name, config.name, microseconds,
                        flops / microseconds * 1e-6);
        }
        CHECK_CUDA(cudaFree(a));
        CHECK_CUDA(cudaFree(w));
        CHECK_CUDA(cudaFree(c));
    }
}

// gate/up with SiLU(gate) x up in the epilogue: the output is (M, inter), the weight (2 inter, K).
const Config kSwigluConfigs[] = {
    {"TMA BN 80, BM 256, 5 st, 1 fly, SwiGLU", launch_tma<80, 256, 5, 1, 1, 0, kStagedSwiglu>},
    {"TMA BN 96, BM 256, 5 st, 1 fly, SwiGLU", launch_tma<96, 256, 5, 1, 1, 0, kStagedSwiglu>},
    {"TMA BN 128, BM 256, 4 st, 1 fly, SwiGLU", launch_tma<128, 256, 4, 1, 1, 0, kStagedSwiglu>},
    {"TMA BN 80, BM 128, 8 st, 1 fly, SwiGLU", launch_tma<80, 128, 8, 1, 1, 0, kStagedSwiglu>},
};

int check_swiglu() {
    const int m = 256, inter = 4864, k = 896;
    __nv_bfloat16 *a, *w, *c;
    float* reference;
    CHECK_CUDA(cudaMalloc(&a, sizeof(__nv_bfloat16) * m * k));
    CHECK_CUDA(cudaMalloc(&w, sizeof(__nv_bfloat16) * 2 * inter * k));
    CHECK_CUDA(cudaMalloc(&c, sizeof(__nv_bfloat16) * m * inter));
    CHECK_CUDA(cudaMalloc(&reference, sizeof(float) * m * 2 * inter));
    fill_random<<<512, 256>>>(a, static_cast<size_t>(m) * k, 1, 2.0f);
    fill_random<<<512, 256>>>(w, static_cast<size_t>(2) * inter * k, 2, 0.1f);
    reference_gemm<<<dim3((2 * inter + 127) / 128, m), 128>>>(a, w, reference, m, 2 * inter, k);
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<float> products(static_cast<size_t>(m) * 2 * inter), expected(static_cast<size_t>(m) * inter);
    CHECK_CUDA(cudaMemcpy(products.data(), reference, sizeof(float) * products.size(), cudaMemcpyDeviceToHost));
    float largest = 0.0f;
    for (int row = 0; row < m; ++row)
        for (int column = 0; column < inter; ++column) {  // the composition's rounding: bf16 products, fp32 SiLU x up
            const float gate = __bfloat162float(__float2bfloat16(products[static_cast<size_t>(row) * 2 * inter + column]));
            const float up =
                __bfloat162float(__float2bfloat16(products[static_cast<size_t>(row) * 2 * inter + inter + column]));
            const float value = gate / (1.0f + std::exp(-gate)) * up;
            expected[static_cast<size_t>(row) * inter + column] = value;
            largest = std::fmax(largest, std::fabs(value));
        }
    bool all_ok = true;
    for (const Config& config : kSwigluConfigs)
        all_ok = check_launch(config, "SwiGLU", a, w, c, m, inter, k, expected, largest) && all_ok;
    CHECK_CUDA(cudaFree(a));
    CHECK_CUDA(cudaFree(w));
    CHECK_CUDA(cudaFree(c));
    CHECK_CUDA(cudaFree(reference));
    return all_ok ? 0 : 1;
}

void time_swiglu() {
    const int m = 256, inter = 4864, k = 896, layers = 24;
    __nv_bfloat16 *a, *w, *c;
    CHECK_CUDA(cudaMalloc(&a, sizeof(__nv_bfloat16) * m * k));
    CHECK_CUDA(cudaMalloc(&w, sizeof(__nv_bfloat16) * layers * 2 * inter * k));
    CHECK_CUDA(cudaMalloc(&c, sizeof(__nv_bfloat16) * layers * m * inter));
    fill_random<<<512, 256>>>(a, static_cast<size_t>(m) * k, 1, 2.0f);
    fill_random<<<512, 256>>>(w, static_cast<size_t>(layers) * 2 * inter * k, 2, 0.1f);
    CHECK_CUDA(cudaDeviceSynchronize());
    for (const Config& config : kSwigluConfigs) {
        const double milliseconds = graph_median_ms(
            [&](cudaStream_t stream) {
                for (int layer = 0; layer < layers; ++layer)
                    config.launch(a, w + static_cast<size_t>(layer) * 2 * inter * k,
                                  c + static_cast<size_t>(layer) * m * inter, m, inter, k, stream);
            },
            20);
        std::printf("time %-8s %-40s %6.2f us per product\n", "SwiGLU", config.name, milliseconds * 1e3 / layers);
    }
    CHECK_CUDA(cudaFree(a));
    CHECK_CUDA(cudaFree(w));
    CHECK_CUDA(cudaFree(c));
}

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "check";
    if (mode == "check") return check() | check_swiglu();
    if (mode == "time") {
        time_all();
        time_swiglu();
        return 0;
    }
    std::fprintf(stderr, "usage: %s check | time\n", argv[0]);
    return 2;
}
