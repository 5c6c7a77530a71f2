// Paged decode attention for bf16 on sm_80+: the kernel and its launcher, free of torch, so that
// `paged_decode.cu` (the engine's torch entry, built by `cuda_decode.py`) and the standalone benchmark
// `benchmarks/csrc/decode_attention_harness.cu` (built with plain nvcc, no torch) run the same code.
//
// One CTA per (sequence, kv head), W warps. The context is cut into tiles of 16 positions (a tile lies in one
// KV block: the block size is a multiple of 16); warp w takes tiles w, w + W, ... and keeps its own online
// softmax, and the warps' states are merged through shared memory at the end. Each warp streams its tiles
// through its own ring of S shared-memory stages with cp.async, S - 1 tiles in flight while it computes one.
// Before reading, the CTA stores the step's new key/value at its slot (the last position of the context), and
// a barrier makes it visible.
//
// Fragments (mma.m16n8k16, A row-major 16x16, B column-major 16x8, C 16x8; lane = 4 * group + quad):
//  - S = Q K^T: the query heads are the rows (<= 8 of them: rows 8-15 and a1/a3 stay zero). A dot product
//    does not care in which order its dimensions are summed, so quad q owns dimensions 32 i + 8 q .. + 8
//    (i < D/32) of Q and K, and k-step s uses the lane's words 2s and 2s + 1: a warp's 16-byte key loads cover
//    whole 64-byte runs of each row. B's column n = group, so lane (group, quad) loads position 8 t + group of
//    n-tile t (t = 0, 1).
//  - The C layout of S's two n-tiles is the A layout of P for P V (k = the 16 positions).
//  - P V: output dimension n of n-tile j is physical dimension n D/8 + j, so lane (group, quad) needs
//    dimensions [group D/8, (group + 1) D/8) of positions 2 quad, 2 quad + 1, 2 quad + 8, 2 quad + 9: again
//    16-byte loads, paired into B's bf16x2 registers by byte permutes.

#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace asyncrl_decode {

// Pointers and strides (in elements) of one launch. Caches are (blocks, block_size, kv heads, D).
struct DecodeParams {
    const __nv_bfloat16* query;  // (sequences, heads, D)
    int64_t query_stride_sequence, query_stride_head;
    const __nv_bfloat16* new_key;  // (sequences, kv heads, D), stored at write_slots
    int64_t new_key_stride_sequence, new_key_stride_head;
    const __nv_bfloat16* new_value;
    int64_t new_value_stride_sequence, new_value_stride_head;
    const int64_t* write_slots;  // (sequences,) block * block_size + offset of each context's last position
    __nv_bfloat16* key_cache;
    __nv_bfloat16* value_cache;
    int64_t stride_block, stride_token, stride_head;
    int block_size;
    const int* block_tables;  // (sequences, width)
    int64_t stride_table;
    const int* context_lens;  // (sequences,) including the new token
    const int* row_order;     // (sequences,) the order CTAs start in, or nullptr
    __nv_bfloat16* output;    // (sequences, heads, D)
    int64_t output_stride_sequence, output_stride_head;
    int num_sequences, num_kv_heads, group_size;
    float scale_log2;  // log2(e) / sqrt(D)
};

constexpr float kNegativeLarge = -1.0e30f;  // a finite -inf: exp2(kNegativeLarge - m) is 0, never NaN
constexpr int kTile = 16;

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

// 2^x by the special-function unit (ex2.approx: relative error ~2^-22, as Triton's exp lowers to).
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float low, float high) {
    __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
    return *reinterpret_cast<uint32_t*>(&pair);
}

template <int N>
__device__ __forceinline__ uint32_t word_of(const uint4 (&vectors)[N], int index) {
    return reinterpret_cast<const uint32_t*>(vectors)[index];
}

// The 16-byte vectors one lane loads for one tile.
template <int D>
struct TileRegisters {
    uint4 key[2][D / 32];    // positions group and 8 + group, dimensions [quad D/4, (quad + 1) D/4)
    uint4 value[4][D / 64];  // positions 2 quad, 2 quad + 1, 2 quad + 8, 2 quad + 9, dims [group D/8, ...)
};

template <int D>
constexpr int kVectors = 2 * (D / 32) + 4 * (D / 64);  // per lane per tile: keys, then values

// 16 bytes global -> shared without passing through registers (cp.async, L2 only); `fill` false writes zeros.
__device__ __forceinline__ void copy_async(uint4* destination, const void* source, bool fill) {
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(destination));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(source), "r"(fill ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int Pending>
__device__ __forceinline__ void wait_copies() { asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory"); }

// A warp's ring of tiles in shared memory. Each lane reads back only the vectors it copied itself, so waiting
// on its own copies is all the synchronisation there is. Vector v of a lane sits at [v][lane]: a warp's
// 16-byte accesses cover 512 contiguous bytes.
template <int D>
__device__ __forceinline__ void issue_tile(uint4* stage, const DecodeParams& cache, int block, int kv_head,
                                           int tile_start, int length, int group, int quad, int lane) {
    const int64_t base = static_cast<int64_t>(block) * cache.stride_block + kv_head * cache.stride_head +
                         static_cast<int64_t>(tile_start % cache.block_size) * cache.stride_token;
#pragma unroll
    for (int t = 0; t < 2; ++t) {
        const uint4* row = reinterpret_cast<const uint4*>(
            cache.key_cache + base + (8 * t + group) * cache.stride_token + quad * 8);
#pragma unroll
        for (int i = 0; i < D / 32; ++i) copy_async(stage + (t * (D / 32) + i) * 32 + lane, row + 4 * i, true);
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int position = 2 * quad + (r & 1) + 8 * (r >> 1);
        const uint4* row = reinterpret_cast<const uint4*>(
            cache.value_cache + base + position * cache.stride_token + group * (D / 8));
        // Slots past the context may hold anything, NaN included, and 0 x NaN is NaN: zero them.
        const bool inside = tile_start + position < length;
#pragma unroll
        for (int i = 0; i < D / 64; ++i)
            copy_async(stage + (2 * (D / 32) + r * (D / 64) + i) * 32 + lane, row + i, inside);
    }
}

template <int D>
__device__ __forceinline__ void read_tile(TileRegisters<D>& tile, const uint4* stage, int lane) {
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int i = 0; i < D / 32; ++i) tile.key[t][i] = stage[(t * (D / 32) + i) * 32 + lane];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int i = 0; i < D / 64; ++i) tile.value[r][i] = stage[(2 * (D / 32) + r * (D / 64) + i) * 32 + lane];
}

template <int D>
struct SoftmaxState {
    float running_max = kNegativeLarge;  // of row `group`, in log2 units
    float running_sum = 0.0f;            // this lane's share of row `group`'s sum
    float accumulator[D / 8][4] = {};    // per n-tile j: rows group (0, 1) and 8 + group (2, 3, stay zero)
};

template <int D>
__device__ __forceinline__ void attend_tile(SoftmaxState<D>& state, const TileRegisters<D>& tile,
                                            const uint32_t (&query)[D / 8], float scale_log2, int tile_start,
                                            int length, int quad) {
    float scores[2][4] = {};
#pragma unroll
    for (int t = 0; t < 2; ++t) {
#pragma unroll
        for (int step = 0; step < D / 16; ++step) {
            mma_bf16(scores[t], query[2 * step], query[2 * step + 1], word_of(tile.key[t], 2 * step),
                     word_of(tile.key[t], 2 * step + 1));
        }
    }
    float tile_max = kNegativeLarge;
#pragma unroll
    for (int t = 0; t < 2; ++t) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int position = tile_start + 8 * t + 2 * quad + i;
            scores[t][i] = position < length ? scores[t][i] * scale_log2 : kNegativeLarge;
            tile_max = fmaxf(tile_max, scores[t][i]);
        }
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffff, tile_max, 2));
    const float new_max = fmaxf(state.running_max, tile_max);
    const float correction = fast_exp2(state.running_max - new_max);
    state.running_max = new_max;
    float probs[2][2];
    float tile_sum = 0.0f;
#pragma unroll
    for (int t = 0; t < 2; ++t) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            probs[t][i] = fast_exp2(scores[t][i] - new_max);
            tile_sum += probs[t][i];
        }
    }
    state.running_sum = state.running_sum * correction + tile_sum;
    const uint32_t probs_low = pack_bf16(probs[0][0], probs[0][1]);   // positions 2 quad, 2 quad + 1
    const uint32_t probs_high = pack_bf16(probs[1][0], probs[1][1]);  // positions 8 + 2 quad, 9 + 2 quad
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
        state.accumulator[j][0] *= correction;
        state.accumulator[j][1] *= correction;
        // Dimension group D/8 + j of the four positions, two at a time: low halves for even j, high for odd.
        const int index = j / 2;
        const uint32_t selector = (j & 1) ? 0x7632u : 0x5410u;
        const uint32_t b0 = __byte_perm(word_of(tile.value[0], index), word_of(tile.value[1], index), selector);
        const uint32_t b1 = __byte_perm(word_of(tile.value[2], index), word_of(tile.value[3], index), selector);
        mma_bf16(state.accumulator[j], probs_low, probs_high, b0, b1);
    }
}

// Resident CTAs per SM the register budget is cut for: 0.5B's 512 CTAs (256 sequences x 2 kv heads) fit
// 132 SMs x 4 in one wave at 4 warps and <= 128 registers.
template <int D, int W>
constexpr int kMinBlocks = (D == 64 ? 16 : 8) / W;

template <int D, int W, int S>
__global__ void __launch_bounds__(W * 32, kMinBlocks<D, W>) paged_decode_kernel(const DecodeParams p) {
    const int kv_head = blockIdx.x;
    const int sequence = p.row_order != nullptr ? p.row_order[blockIdx.y] : blockIdx.y;
    const int length = p.context_lens[sequence];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = lane / 4, quad = lane % 4;

    // The new key/value of (sequence, kv head) into its slot, D/8 16-byte vectors each.
    if (threadIdx.x < D / 4) {
        const bool is_key = threadIdx.x < D / 8;
        const int chunk = threadIdx.x % (D / 8);
        const int64_t slot = p.write_slots[sequence];
        const int64_t offset = (slot / p.block_size) * p.stride_block + (slot % p.block_size) * p.stride_token +
                               kv_head * p.stride_head + chunk * 8;
        const __nv_bfloat16* source =
            is_key ? p.new_key + sequence * p.new_key_stride_sequence + kv_head * p.new_key_stride_head
                   : p.new_value + sequence * p.new_value_stride_sequence + kv_head * p.new_value_stride_head;
        *reinterpret_cast<uint4*>((is_key ? p.key_cache : p.value_cache) + offset) =
            reinterpret_cast<const uint4*>(source)[chunk];
    }

    // This lane's share of query head `group` (zero for the padding rows).
    uint32_t query_words[D / 8];
    {
        uint4 vectors[D / 32];
        const bool real_head = group < p.group_size;
        const uint4* row = reinterpret_cast<const uint4*>(
            p.query + sequence * p.query_stride_sequence + (kv_head * p.group_size + group) * p.query_stride_head +
            quad * 8);
#pragma unroll
        for (int i = 0; i < D / 32; ++i) vectors[i] = real_head ? row[4 * i] : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int i = 0; i < D / 8; ++i) query_words[i] = word_of(vectors, i);
    }
    __syncthreads();  // the new key/value are in the cache before any warp reads their tile

    const int* table = p.block_tables + sequence * p.stride_table;
    const int num_tiles = (length + kTile - 1) / kTile;
    // Block id of a warp's tile, or 0 past the context (never dereferenced).
    auto block_of = [&](int tile_index) { return tile_index < num_tiles ? table[tile_index * kTile / p.block_size] : 0; };
    extern __shared__ uint4 shared_ring[];  // [S][W][kVectors][32]
    uint4* ring = shared_ring + warp * kVectors<D> * 32;
    auto stage_of = [&](int stage) { return ring + stage * W * kVectors<D> * 32; };
    // S - 1 tiles in flight ahead of the one computing; a group is committed per tile, empty or not, so
    // "all but the newest S - 2 groups done" always means "the oldest tile is here".
#pragma unroll
    for (int stage = 0; stage < S - 1; ++stage) {
        const int tile_index = warp + stage * W;
        if (tile_index < num_tiles)
            issue_tile<D>(stage_of(stage), p, block_of(tile_index), kv_head, tile_index * kTile, length, group,
                          quad, lane);
        commit_copies();
    }
    int pending_block = block_of(warp + (S - 1) * W);
    SoftmaxState<D> state;
    int stage = 0;
    for (int tile_index = warp; tile_index < num_tiles; tile_index += W) {
        wait_copies<S - 2>();
        TileRegisters<D> current;
        read_tile(current, stage_of(stage), lane);
        // Refill the stage read last iteration with the tile S - 1 ahead; its block id was loaded a tile ago.
        const int ahead = tile_index + (S - 1) * W;
        const int block_after = block_of(ahead + W);
        const int refill = stage == 0 ? S - 1 : stage - 1;
        if (ahead < num_tiles)
            issue_tile<D>(stage_of(refill), p, pending_block, kv_head, ahead * kTile, length, group, quad, lane);
        commit_copies();
        pending_block = block_after;
        attend_tile(state, current, query_words, p.scale_log2, tile_index * kTile, length, quad);
        stage = stage + 1 == S ? 0 : stage + 1;
    }
    wait_copies<0>();
    state.running_sum += __shfl_xor_sync(0xffffffff, state.running_sum, 1);
    state.running_sum += __shfl_xor_sync(0xffffffff, state.running_sum, 2);

    // Merge the warps' (max, sum, accumulator) per query head, in the ring's memory once every warp is done.
    __syncthreads();
    float* shared_max = reinterpret_cast<float*>(shared_ring);  // [W][8]
    float* shared_sum = shared_max + W * 8;                       // [W][8]
    float* shared_output = shared_sum + W * 8;                    // [W][8][D]
    if (quad == 0) {
        shared_max[warp * 8 + group] = state.running_max;
        shared_sum[warp * 8 + group] = state.running_sum;
    }
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
        shared_output[(warp * 8 + group) * D + (2 * quad) * (D / 8) + j] = state.accumulator[j][0];
        shared_output[(warp * 8 + group) * D + (2 * quad + 1) * (D / 8) + j] = state.accumulator[j][1];
    }
    __syncthreads();
    for (int index = threadIdx.x; index < p.group_size * D; index += W * 32) {
        const int head = index / D, dim = index % D;
        float merged_max = kNegativeLarge;
#pragma unroll
        for (int w = 0; w < W; ++w) merged_max = fmaxf(merged_max, shared_max[w * 8 + head]);
        float numerator = 0.0f, denominator = 0.0f;
#pragma unroll
        for (int w = 0; w < W; ++w) {
            const float weight = fast_exp2(shared_max[w * 8 + head] - merged_max);  // 0 for a warp that drew no tile
            numerator += weight * shared_output[(w * 8 + head) * D + dim];
            denominator += weight * shared_sum[w * 8 + head];
        }
        p.output[sequence * p.output_stride_sequence + (kv_head * p.group_size + head) * p.output_stride_head + dim] =
            __float2bfloat16(numerator / denominator);
    }
}

template <int D, int W, int S>
constexpr int kRingBytes = S * W * kVectors<D> * 32 * 16;

template <int D, int W, int S>
cudaError_t launch_with(const DecodeParams& params, cudaStream_t stream) {
    // The ring takes more than the 48 KB a launch gets without asking, and the largest shared-memory carveout
    // lets four CTAs' rings share an SM; set once per instantiation.
    static const cudaError_t prepared = [] {
        const cudaError_t status = cudaFuncSetAttribute(
            paged_decode_kernel<D, W, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, kRingBytes<D, W, S>);
        if (status != cudaSuccess) return status;
        return cudaFuncSetAttribute(paged_decode_kernel<D, W, S>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    100);
    }();
    if (prepared != cudaSuccess) {
        cudaGetLastError();  // a refused attribute sets the last error, which the caller's next launch would report
        return prepared;
    }
    const dim3 grid(static_cast<unsigned>(params.num_kv_heads), static_cast<unsigned>(params.num_sequences));
    paged_decode_kernel<D, W, S><<<grid, W * 32, kRingBytes<D, W, S>, stream>>>(params);
    return cudaGetLastError();
}

template <int D, int W>
cudaError_t launch_with_stages(const DecodeParams& params, int stages, cudaStream_t stream) {
    switch (stages) {
        case 2: return launch_with<D, W, 2>(params, stream);
        case 3: return launch_with<D, W, 3>(params, stream);
        case 4: return launch_with<D, W, 4>(params, stream);
        default: return cudaErrorInvalidValue;
    }
}

// Head dimension 64 or 128, 4 or 8 warps, 2-4 stages; anything else is cudaErrorInvalidValue, as is a ring
// larger than an SM's shared memory (cudaFuncSetAttribute's answer).
inline cudaError_t launch_paged_decode(const DecodeParams& params, int head_dim, int warps, int stages,
                                       cudaStream_t stream) {
    if (params.num_sequences == 0) return cudaSuccess;
    if (head_dim == 64 && warps == 4) return launch_with_stages<64, 4>(params, stages, stream);
    if (head_dim == 64 && warps == 8) return launch_with_stages<64, 8>(params, stages, stream);
    if (head_dim == 128 && warps == 4) return launch_with_stages<128, 4>(params, stages, stream);
    if (head_dim == 128 && warps == 8) return launch_with_stages<128, 8>(params, stages, stream);
    return cudaErrorInvalidValue;
}

}  // namespace asyncrl_decode
