// A decode layer's products with their neighbours fused in: out (M, N) bf16 = A (M, K) bf16 x W (N, K)^T on Hopper's
// `wgmma`, fed by TMA (a producer warpgroup, full/empty mbarriers per stage, the 128-byte swizzle), with
// - NORM: the RMS norm folded in. A is the residual stream itself and W carries the norm's weight folded in
//   (W[n, k] * g[k]); the epilogue scales its rows by r = rsqrt(mean(a^2) + eps), since
//   norm(a) x W^T = r * (a x (W * g)^T), so the norm's own kernel goes away. The rows' sums of squares come
//   - kNormInKernel: from the A tiles, each consumer thread summing one row of every tile as it arrives (q/k/v and
//     gate/up read K = hidden in full, so each CTA sees its rows whole);
//   - kNormFromStats: from `sum_squares_in`, which the residual epilogue of the product before added up
//     (`sum_squares_out`: each CTA adds its columns' squares of the rounded stream, one atomic per row). A product
//     that reads one buffer zeroes the other (`sum_squares_clear`), whose last reader has finished by then;
// - a bias (q/k/v), added in fp32 before the output's rounding, as cuBLAS's bias epilogue does;
// - kSwiglu: SiLU(gate) x up. The B tile is BN / 2 gate rows and the matching BN / 2 up rows (two TMA boxes), so a
//   thread holds both halves of its outputs; both are rounded to bf16 first, as the product's output would be;
// - kResidual: out = residual + product, the product rounded to bf16 first and the sum once, as the engine's
//   `residual_add` rounds; the residual's chunks are loaded before the K loop, so their latency hides in it;
// - SPLITS > 1: K split over a cluster of SPLITS CTAs. Each leaves its fp32 partial tile in its shared memory, and
//   rank s sums rows [s BM / SPLITS, (s + 1) BM / SPLITS) of all of them through distributed shared memory, so the
//   split needs no second kernel (cuBLAS's split-K for down launches a reduction kernel);
// - launched as a programmatic dependent launch (`launch(..., programmatic = true)`), a product starts while the one
//   before it finishes: its barriers and its first stages of weights, which no product writes, are set up and
//   requested before `griddepcontrol.wait`; A, the residual and the statistics are read after it. Each product lets
//   the next one launch once it is past its own wait, so at most one product runs ahead.
// The torch entry is fused_products.cu; tests/engine/test_fused_decode.py checks each product against the model's
// composition in torch. sm_90a only.

#pragma once

#include "hopper_gemm_primitives.cuh"

namespace fused {

constexpr int kPlain = 0, kSwiglu = 1, kResidual = 2;

struct Arguments {
    __nv_bfloat16* out;             // (m, n); with kSwiglu the weight has 2 n rows, gate rows then up rows
    const __nv_bfloat16* bias;      // (n) or nullptr
    const __nv_bfloat16* residual;  // (m, n), kResidual
    int m, n, k;
    float eps;                    // NORM
    const float* sum_squares_in;  // (m), kNormFromStats
    float* sum_squares_out;       // (m) or nullptr, kResidual: the output rows' sums of squares added in
    float* sum_squares_clear;     // (m) or nullptr: zeroed by this product's first CTA
};

constexpr int kNoNorm = 0, kNormInKernel = 1, kNormFromStats = 2;

__device__ __forceinline__ uint32_t load_shared_u32(uint32_t address) {
    uint32_t value;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(value) : "r"(address));
    return value;
}

__host__ __device__ __forceinline__ float bf16_round(float value) { return __bfloat162float(__float2bfloat16(value)); }

// The sum of squares of one 64-wide row of a swizzled A tile. Thread t starts at chunk t % 8, so the eight rows
// of a quarter-warp read eight distinct 16-byte bank groups; the swizzle only permutes a row's chunks.
__device__ __forceinline__ float row_sum_squares(uint32_t row_address, int start) {
    float sums[8] = {};  // one chain per chunk: a single chain of 64 dependent FMAs would be the loop's latency
#pragma unroll
    for (int c = 0; c < 8; ++c) {
        uint4 chunk;
        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(chunk.x), "=r"(chunk.y), "=r"(chunk.z), "=r"(chunk.w)
                     : "r"(row_address + ((c + start) & 7) * 16));
        const uint32_t words[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const float low = __uint_as_float(words[w] << 16), high = __uint_as_float(words[w] & 0xFFFF0000u);
            sums[c] = fmaf(low, low, fmaf(high, high, sums[c]));
        }
    }
    return ((sums[0] + sums[1]) + (sums[2] + sums[3])) + ((sums[4] + sums[5]) + (sums[6] + sums[7]));
}

// Row pitch in 4-byte words of an fp32 partial tile BN wide: float2 writes of 8 rows x 4 lanes per half-warp phase
// land on distinct banks when the pitch is 8 mod 32.
__host__ __device__ constexpr int partial_pitch_words(int columns) { return columns + 8; }

template <int BN, int BM, int STAGES, int EPILOGUE, int NORM, int SPLITS>
struct Layout {
    static constexpr int kABytes = BM * 128, kBBytes = BN * 128, kStageBytes = kABytes + kBBytes;
    static constexpr int kConsumers = BM / 128;
    static constexpr int kColumns = EPILOGUE == kSwiglu ? BN / 2 : BN;  // output columns of a tile
    static constexpr int kRingBytes = STAGES * kStageBytes;
    // After the ring: full and empty barriers, then one scale per row.
    static constexpr int kSharedBytes = 1024 + kRingBytes + STAGES * 16 + BM * 4;
    static constexpr int kStagedPitch = staged_pitch_words(kColumns) * 4;  // bytes
    static constexpr int kPartialPitch = partial_pitch_words(BN) * 4;      // bytes
    static constexpr int kChunks = kColumns / 8;                           // 16-byte output chunks per row
    // A consumer thread's share of the output chunks (the store loop's items), for the residual's prefetch.
    static constexpr int kStoreItems = SPLITS > 1 ? (BM / SPLITS) * kChunks / BM : kChunks;
    static_assert(kBBytes % 1024 == 0 && (EPILOGUE != kSwiglu || BN % 16 == 0), "tiles on 1024-byte boundaries");
    static_assert(BM * kStagedPitch <= kRingBytes && BM * kPartialPitch <= kRingBytes, "the staged tile fits");
    static_assert(!(NORM == kNormInKernel && SPLITS > 1), "the norm in the kernel needs all of K in one CTA");
    static_assert(SPLITS == 1 || (EPILOGUE != kSwiglu && (BM / SPLITS) * kChunks % BM == 0),
                  "split tiles: every consumer thread reduces the same number of chunks");
};

// Item i of a consumer thread's stores: its (row of the tile, 16-byte chunk). Without a split a warpgroup stores its
// own 128 rows; split, the consumers together store rank `rank`'s slice of BM / SPLITS rows.
template <typename L, int SPLITS>
__device__ __forceinline__ int2 store_item(int i, int rank) {
    const int thread = threadIdx.x;
    if constexpr (SPLITS > 1) {
        const int index = thread + i * (L::kConsumers * 128);
        return make_int2(rank * (L::kConsumers * 128 / SPLITS) + index / L::kChunks, index % L::kChunks);
    } else {
        const int index = thread % 128 + i * 128;
        return make_int2((thread / 128) * 128 + index / L::kChunks, index % L::kChunks);
    }
}

// What a consumer thread's epilogue reads from global memory, loaded before the K loop so the loads' latency hides
// in it: the residual's chunks it will store, the bias of its accumulator columns, its row's sum of squares.
template <typename L>
struct Prefetched {
    uint4 residual[L::kStoreItems];
    float bias[L::kColumns / 8][2];
    float sum_squares;
};

template <typename L, int EPILOGUE, int NORM, int SPLITS>
__device__ __forceinline__ void prefetch(Prefetched<L>& inputs, const Arguments& args, int m0, int n0, int rank) {
    if constexpr (EPILOGUE == kResidual) {
#pragma unroll
        for (int i = 0; i < L::kStoreItems; ++i) {
            const int2 item = store_item<L, SPLITS>(i, rank);
            const int row = m0 + item.x, column = n0 + item.y * 8;
            inputs.residual[i] = make_uint4(0, 0, 0, 0);
            if (row < args.m && column < args.n)
                inputs.residual[i] =
                    *reinterpret_cast<const uint4*>(args.residual + static_cast<size_t>(row) * args.n + column);
        }
    }
    if (args.bias != nullptr) {
        const int q = threadIdx.x % 4;
#pragma unroll
        for (int j = 0; j < L::kColumns / 8; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int column = n0 + j * 8 + q * 2 + c;
                inputs.bias[j][c] = column < args.n ? __bfloat162float(args.bias[column]) : 0.0f;
            }
    }
    if constexpr (NORM == kNormFromStats) {
        const int row = m0 + static_cast<int>(threadIdx.x);
        inputs.sum_squares = row < args.m ? args.sum_squares_in[row] : 0.0f;
    }
}

// out's 8 bf16 at (row, column): `values` (bf16 pairs), plus the residual's chunk with kResidual. Returns the sum of
// the stored values' squares (the next norm's statistics).
template <int EPILOGUE>
__device__ __forceinline__ float store_chunk(const Arguments& args, int row, int column, uint4 values,
                                             const uint4& residual) {
    float squares = 0.0f;
    if constexpr (EPILOGUE == kResidual) {
        const uint32_t* product = &values.x;
        const uint32_t* stream = &residual.x;
        uint32_t sums[4];
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&product[w]));
            const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&stream[w]));
            const __nv_bfloat162 sum = __floats2bfloat162_rn(a.x + b.x, a.y + b.y);
            const float2 rounded = __bfloat1622float2(sum);
            squares = fmaf(rounded.x, rounded.x, fmaf(rounded.y, rounded.y, squares));
            sums[w] = *reinterpret_cast<const uint32_t*>(&sum);
        }
        values = make_uint4(sums[0], sums[1], sums[2], sums[3]);
    }
    *reinterpret_cast<uint4*>(args.out + static_cast<size_t>(row) * args.n + column) = values;
    return squares;
}

// The chunks' squares of one row summed over the kChunks consecutive lanes that stored it, and added to the row's
// statistics by the first of them: one atomic per row and CTA. Every lane calls it (masked ones with 0).
template <typename L>
__device__ __forceinline__ void add_row_squares(const Arguments& args, int global_row, int chunk, float squares) {
    static_assert(L::kChunks <= 32 && (L::kChunks & (L::kChunks - 1)) == 0, "a row's chunks in one warp");
#pragma unroll
    for (int offset = L::kChunks / 2; offset > 0; offset /= 2)
        squares += __shfl_xor_sync(0xFFFFFFFFu, squares, offset);
    if (args.sum_squares_out != nullptr && chunk == 0 && global_row < args.m)
        atomicAdd(args.sum_squares_out + global_row, squares);
}

// A consumer warpgroup's epilogue without a split: the accumulators scaled by the rows' r, biased or SwiGLU'd,
// rounded to bf16 into a staged tile (rows padded so the writes hit 32 distinct banks), then stored in 16-byte row
// chunks.
template <typename L, int BN, int EPILOGUE, int NORM>
__device__ __forceinline__ void store_tile(const float (&accumulators)[2][BN / 2], uint32_t base, uint32_t scales,
                                           const Arguments& args, int m0, int n0, const Prefetched<L>& inputs) {
    const int thread = threadIdx.x, warpgroup = thread / 128;
    const int warp = (thread % 128) / 32, lane = thread % 32, g = lane / 4, q = lane % 4;
    const uint32_t staged = base + warpgroup * 128 * L::kStagedPitch;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = half * 64 + warp * 16 + g;
        float scale[2] = {1.0f, 1.0f};
        if constexpr (NORM != kNoNorm) {
            scale[0] = __uint_as_float(load_shared_u32(scales + (warpgroup * 128 + row) * 4));
            scale[1] = __uint_as_float(load_shared_u32(scales + (warpgroup * 128 + row + 8) * 4));
        }
#pragma unroll
        for (int j = 0; j < L::kColumns / 8; ++j) {
            float values[4];
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                values[r] = accumulators[half][j * 4 + r] * scale[r / 2];
                if constexpr (EPILOGUE == kSwiglu) {
                    const float gate = bf16_round(values[r]);
                    const float up = bf16_round(accumulators[half][(j + BN / 16) * 4 + r] * scale[r / 2]);
                    values[r] = __fdividef(gate, 1.0f + __expf(-gate)) * up;  // IEEE division: ~2 us more
                }
            }
            if (args.bias != nullptr) {
                values[0] += inputs.bias[j][0], values[1] += inputs.bias[j][1];
                values[2] += inputs.bias[j][0], values[3] += inputs.bias[j][1];
            }
            const __nv_bfloat162 top = __floats2bfloat162_rn(values[0], values[1]);
            const __nv_bfloat162 bottom = __floats2bfloat162_rn(values[2], values[3]);
            const uint32_t address = staged + row * L::kStagedPitch + (j * 8 + q * 2) * 2;
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address), "r"(*reinterpret_cast<const uint32_t*>(&top)));
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address + 8 * L::kStagedPitch),
                         "r"(*reinterpret_cast<const uint32_t*>(&bottom)));
        }
    }
    asm volatile("bar.sync %0, 128;\n" ::"r"(2 + warpgroup) : "memory");  // this warpgroup's tile is staged
#pragma unroll
    for (int i = 0; i < L::kStoreItems; ++i) {
        const int2 item = store_item<L, 1>(i, 0);
        const int row = item.x % 128, global_row = m0 + item.x, column = n0 + item.y * 8;
        float squares = 0.0f;
        if (global_row < args.m && column < args.n) {
            uint4 value;
            asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(value.x), "=r"(value.y), "=r"(value.z), "=r"(value.w)
                         : "r"(staged + row * L::kStagedPitch + item.y * 16));
            squares = store_chunk<EPILOGUE>(args, global_row, column, value, inputs.residual[i]);
        }
        if constexpr (EPILOGUE == kResidual) add_row_squares<L>(args, global_row, item.y, squares);
    }
}

// A consumer warpgroup's fp32 partial tile into shared memory (split K): float2 per accumulator pair.
template <typename L, int BN>
__device__ __forceinline__ void stage_partials(const float (&accumulators)[2][BN / 2], uint32_t base) {
    const int thread = threadIdx.x, warpgroup = thread / 128;
    const int warp = (thread % 128) / 32, lane = thread % 32, g = lane / 4, q = lane % 4;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = warpgroup * 128 + half * 64 + warp * 16 + g;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            const float* values = &accumulators[half][j * 4];
            const uint32_t address = base + row * L::kPartialPitch + (j * 8 + q * 2) * 4;
            asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(address), "f"(values[0]), "f"(values[1]));
            asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(address + 8 * L::kPartialPitch), "f"(values[2]),
                         "f"(values[3]));
        }
    }
}

// Rank `rank`'s slice of the split tile: every CTA's partials summed through distributed shared memory, rounded,
// stored (with the residual). Runs after a cluster barrier that follows every CTA's `stage_partials`.
template <typename L, int EPILOGUE, int SPLITS>
__device__ __forceinline__ void reduce_partials(uint32_t base, const Arguments& args, int m0, int n0, int rank,
                                                const Prefetched<L>& inputs) {
#pragma unroll
    for (int i = 0; i < L::kStoreItems; ++i) {
        const int2 item = store_item<L, SPLITS>(i, rank);
        const int row = item.x, chunk = item.y;
        float sums[8] = {};
#pragma unroll
        for (int source = 0; source < SPLITS; ++source) {
            uint32_t remote;
            asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
                         : "=r"(remote)
                         : "r"(base + row * L::kPartialPitch + chunk * 32), "r"(source));
#pragma unroll
            for (int v = 0; v < 2; ++v) {
                float4 part;
                asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                             : "=f"(part.x), "=f"(part.y), "=f"(part.z), "=f"(part.w)
                             : "r"(remote + v * 16));
                sums[v * 4] += part.x, sums[v * 4 + 1] += part.y, sums[v * 4 + 2] += part.z, sums[v * 4 + 3] += part.w;
            }
        }
        const int global_row = m0 + row, column = n0 + chunk * 8;
        float squares = 0.0f;
        if (global_row < args.m && column < args.n) {
            uint32_t packed[4];
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const __nv_bfloat162 pair = __floats2bfloat162_rn(sums[2 * w], sums[2 * w + 1]);
                packed[w] = *reinterpret_cast<const uint32_t*>(&pair);
            }
            squares = store_chunk<EPILOGUE>(args, global_row, column, make_uint4(packed[0], packed[1], packed[2], packed[3]),
                                            inputs.residual[i]);
        }
        if constexpr (EPILOGUE == kResidual) add_row_squares<L>(args, global_row, chunk, squares);
    }
}

template <int BN, int BM, int STAGES, int EPILOGUE, int NORM, int SPLITS>
__global__ void __launch_bounds__(BM + 128) fused_product(const __grid_constant__ CUtensorMap map_a,
                                                          const __grid_constant__ CUtensorMap map_w,
                                                          const Arguments args) {
    using L = Layout<BN, BM, STAGES, EPILOGUE, NORM, SPLITS>;
    extern __shared__ unsigned char shared_raw[];
    const uint32_t base = (shared_address(shared_raw) + 1023) & ~1023u;
    const uint32_t full = base + L::kRingBytes, empty = full + STAGES * 8, scales = empty + STAGES * 8;
    const int thread = threadIdx.x, warpgroup = thread / 128;
    const int tile = blockIdx.x / SPLITS, rank = blockIdx.x % SPLITS;  // clusters of SPLITS along x: rank = split
    const int n0 = tile * L::kColumns, m0 = blockIdx.y * BM;
    const int total_blocks = args.k / 64;
    const int first_block = rank * total_blocks / SPLITS, num_blocks = (rank + 1) * total_blocks / SPLITS - first_block;
    if (thread == 0) {
        for (int stage = 0; stage < STAGES; ++stage) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(full + stage * 8));
            // Each consumer warp frees a stage once its reads of it (wgmma's and the norm's) are done.
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(empty + stage * 8), "r"(L::kConsumers * 4));
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    Prefetched<L> inputs;
    if (warpgroup == L::kConsumers) {  // the producer
        if (thread % 128 == 0) {
            auto load_weights = [&](int block) {
                const uint32_t tile_b = base + (block % STAGES) * L::kStageBytes + L::kABytes, k0 = (first_block + block) * 64;
                const uint32_t barrier = full + (block % STAGES) * 8;
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier),
                             "r"(L::kStageBytes)
                             : "memory");
                if constexpr (EPILOGUE == kSwiglu) {
                    tma_load_2d(tile_b, &map_w, k0, n0, barrier);
                    tma_load_2d(tile_b + BN / 2 * 128, &map_w, k0, args.n + n0, barrier);
                } else {
                    tma_load_2d(tile_b, &map_w, k0, n0, barrier);
                }
            };
            auto load_a = [&](int block) {
                tma_load_2d(base + (block % STAGES) * L::kStageBytes, &map_a, (first_block + block) * 64, m0,
                            full + (block % STAGES) * 8);
            };
            const int ahead = num_blocks < STAGES ? num_blocks : STAGES;
            for (int block = 0; block < ahead; ++block) load_weights(block);
            asm volatile("griddepcontrol.wait;\n" ::: "memory");  // A is the product before's output
            for (int block = 0; block < ahead; ++block) load_a(block);
            for (int block = ahead; block < num_blocks; ++block) {
                barrier_wait(empty + (block % STAGES) * 8, ((block / STAGES) & 1) ^ 1);
                load_weights(block);
                load_a(block);
            }
        }
    } else {
        asm volatile("griddepcontrol.wait;\n" ::: "memory");  // the residual and the statistics: written before
        asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
        if (args.sum_squares_clear != nullptr && blockIdx.x == 0 && blockIdx.y == 0)
            for (int row = thread; row < args.m; row += BM) args.sum_squares_clear[row] = 0.0f;
        prefetch<L, EPILOGUE, NORM, SPLITS>(inputs, args, m0, n0, rank);
        const int lane = thread % 32, row = thread;  // the norm: this thread's row of the tile
        float accumulators[2][BN / 2] = {};
        float sum_squares = 0.0f;
        for (int block = 0; block < num_blocks; ++block) {
            const int stage = block % STAGES;
            barrier_wait(full + stage * 8, (block / STAGES) & 1);
            const uint32_t tile_a = base + stage * L::kStageBytes;
            multiply_block<BN>(accumulators, tile_a, tile_a + L::kABytes, warpgroup);
            if constexpr (NORM == kNormInKernel) sum_squares += row_sum_squares(tile_a + row * 128, thread);
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
            if (block >= 1) {  // the previous block's group is done: its stage is free
                __syncwarp();
                if (lane == 0)
                    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(empty + ((block - 1) % STAGES) * 8)
                                 : "memory");
            }
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        if constexpr (NORM == kNormFromStats) sum_squares = inputs.sum_squares;
        if constexpr (NORM != kNoNorm) {
            const float scale = rsqrtf(sum_squares / static_cast<float>(args.k) + args.eps);
            asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(scales + row * 4), "f"(scale));
        }
        // Every consumer is past its last block (a slower warpgroup may still read the ring), then the ring is free.
        asm volatile("bar.sync 1, %0;\n" ::"n"(BM) : "memory");
        if constexpr (SPLITS > 1)
            stage_partials<L, BN>(accumulators, base);
        else
            store_tile<L, BN, EPILOGUE, NORM>(accumulators, base, scales, args, m0, n0, inputs);
    }
    if constexpr (SPLITS > 1) {
        // Every CTA's partials are staged before any rank reads them, and no CTA leaves while another may still read.
        asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
        if (warpgroup < L::kConsumers) reduce_partials<L, EPILOGUE, SPLITS>(base, args, m0, n0, rank, inputs);
        asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
    }
}

template <int BN, int BM, int STAGES, int EPILOGUE, int NORM, int SPLITS>
void launch(const __nv_bfloat16* a, const __nv_bfloat16* w, const Arguments& args, cudaStream_t stream,
            bool programmatic) {
    using L = Layout<BN, BM, STAGES, EPILOGUE, NORM, SPLITS>;
    auto kernel = fused_product<BN, BM, STAGES, EPILOGUE, NORM, SPLITS>;
    static bool configured = false;
    if (!configured) {
        HOPPER_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kSharedBytes));
        // The largest shared-memory carveout, whatever this launch needs: a CTA of the next product can then start
        // on an SM whose CTA of this one still runs, where their rings fit side by side (an SM's carveout changes
        // only while it is idle).
        HOPPER_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                         cudaSharedmemCarveoutMaxShared));
        configured = true;
    }
    const bool swiglu = EPILOGUE == kSwiglu;
    const CUtensorMap map_a = tensor_map(a, args.m, args.k, BM),
                      map_w = tensor_map(w, swiglu ? 2 * args.n : args.n, args.k, swiglu ? BN / 2 : BN);
    const int tiles = (args.n + L::kColumns - 1) / L::kColumns;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(tiles * SPLITS, (args.m + BM - 1) / BM);
    config.blockDim = dim3(BM + 128);
    config.dynamicSmemBytes = L::kSharedBytes;
    config.stream = stream;
    cudaLaunchAttribute attributes[2];
    attributes[0].id = cudaLaunchAttributeClusterDimension;
    attributes[0].val.clusterDim.x = SPLITS;
    attributes[0].val.clusterDim.y = 1;
    attributes[0].val.clusterDim.z = 1;
    attributes[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[1].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attributes;
    config.numAttrs = programmatic ? 2 : 1;
    HOPPER_CUDA(cudaLaunchKernelEx(&config, kernel, map_a, map_w, args));
}

}  // namespace fused
