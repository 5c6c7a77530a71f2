// Paged decode attention for bf16 on sm_80+ (the engine's CUDA path; `cuda_decode.py` builds and calls it).
//
// Why a CUDA kernel next to the Triton one: the Triton kernel cannot keep a second K/V tile in flight (the
// block-id load the tile's addresses depend on takes its pipeline stage), and even a Triton kernel that only
// reads the same tiles plateaus at ~3.2-3.5 TB/s on an H200. Here every warp loads its next tile into
// registers while it computes the current one, straight from global memory into the tensor cores' fragment
// layout: no shared-memory staging.
//
// One CTA per (sequence, kv head), W warps. The context is cut into tiles of 16 positions (a tile lies in one
// KV block: the block size is a multiple of 16); warp w takes tiles w, w + W, ... and keeps its own online
// softmax, and the warps' states are merged through shared memory at the end. Before reading, the CTA stores
// the step's new key/value at its slot (the last position of the context), and a barrier makes it visible.
//
// Fragments (mma.m16n8k16, A row-major 16x16, B column-major 16x8, C 16x8; lane = 4 * group + quad):
//  - S = Q K^T: the query heads are the rows (<= 8 of them: rows 8-15 and a1/a3 stay zero). A dot product
//    does not care in which order its dimensions are summed, so quad q owns dimensions [q D/4, (q + 1) D/4)
//    of Q and K, and step s of the D/16 k-steps uses that range's words 2s and 2s + 1: every lane loads its
//    keys as 16-byte vectors. B's column n = group, so lane (group, quad) loads position 8 t + group of
//    n-tile t (t = 0, 1).
//  - The C layout of S's two n-tiles is the A layout of P for P V (k = the 16 positions).
//  - P V: output dimension n of n-tile j is physical dimension n D/8 + j, so lane (group, quad) needs
//    dimensions [group D/8, (group + 1) D/8) of positions 2 quad, 2 quad + 1, 2 quad + 8, 2 quad + 9: again
//    16-byte loads, paired into B's bf16x2 registers by byte permutes.

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

#include <cmath>
#include <cstdint>
#include <optional>

namespace {

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

struct CacheView {
    const __nv_bfloat16* key;
    const __nv_bfloat16* value;
    int64_t stride_block, stride_token, stride_head;
    int block_size;
};

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
__device__ __forceinline__ void issue_tile(uint4* stage, const CacheView& cache, int block, int kv_head,
                                           int tile_start, int length, int group, int quad, int lane) {
    const int64_t base = static_cast<int64_t>(block) * cache.stride_block + kv_head * cache.stride_head +
                         static_cast<int64_t>(tile_start % cache.block_size) * cache.stride_token;
#pragma unroll
    for (int t = 0; t < 2; ++t) {
        const uint4* row = reinterpret_cast<const uint4*>(
            cache.key + base + (8 * t + group) * cache.stride_token + quad * 8);
#pragma unroll
        for (int i = 0; i < D / 32; ++i) copy_async(stage + (t * (D / 32) + i) * 32 + lane, row + 4 * i, true);
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int position = 2 * quad + (r & 1) + 8 * (r >> 1);
        const uint4* row = reinterpret_cast<const uint4*>(
            cache.value + base + position * cache.stride_token + group * (D / 8));
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
__global__ void __launch_bounds__(W * 32, kMinBlocks<D, W>) paged_decode_kernel(
    const __nv_bfloat16* query, int64_t stride_query_sequence, int64_t stride_query_head,
    const __nv_bfloat16* new_key, int64_t stride_new_key_sequence, int64_t stride_new_key_head,
    const __nv_bfloat16* new_value, int64_t stride_new_value_sequence, int64_t stride_new_value_head,
    const int64_t* write_slots, __nv_bfloat16* key_cache, __nv_bfloat16* value_cache, int64_t stride_block,
    int64_t stride_token, int64_t stride_head, int block_size, const int* block_tables, int64_t stride_table,
    const int* context_lens, const int* row_order, __nv_bfloat16* output, int64_t stride_output_sequence,
    int64_t stride_output_head, int group_size, float scale_log2) {
    const int kv_head = blockIdx.x;
    const int sequence = row_order != nullptr ? row_order[blockIdx.y] : blockIdx.y;
    const int length = context_lens[sequence];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = lane / 4, quad = lane % 4;

    // The new key/value of (sequence, kv head) into its slot, D/8 16-byte vectors each.
    if (threadIdx.x < D / 4) {
        const bool is_key = threadIdx.x < D / 8;
        const int chunk = threadIdx.x % (D / 8);
        const int64_t slot = write_slots[sequence];
        const int64_t offset = (slot / block_size) * stride_block + (slot % block_size) * stride_token +
                               kv_head * stride_head + chunk * 8;
        const __nv_bfloat16* source =
            is_key ? new_key + sequence * stride_new_key_sequence + kv_head * stride_new_key_head
                   : new_value + sequence * stride_new_value_sequence + kv_head * stride_new_value_head;
        *reinterpret_cast<uint4*>((is_key ? key_cache : value_cache) + offset) =
            reinterpret_cast<const uint4*>(source)[chunk];
    }

    // This lane's share of query head `group` (zero for the padding rows).
    uint32_t query_words[D / 8];
    {
        uint4 vectors[D / 32];
        const bool real_head = group < group_size;
        const uint4* row = reinterpret_cast<const uint4*>(
            query + sequence * stride_query_sequence + (kv_head * group_size + group) * stride_query_head + quad * 8);
#pragma unroll
        for (int i = 0; i < D / 32; ++i) vectors[i] = real_head ? row[4 * i] : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int i = 0; i < D / 8; ++i) query_words[i] = word_of(vectors, i);
    }
    __syncthreads();  // the new key/value are in the cache before any warp reads their tile

    const CacheView cache{key_cache, value_cache, stride_block, stride_token, stride_head, block_size};
    const int* table = block_tables + sequence * stride_table;
    const int num_tiles = (length + kTile - 1) / kTile;
    // Block id of a warp's tile, or 0 past the context (never dereferenced).
    auto block_of = [&](int tile_index) { return tile_index < num_tiles ? table[tile_index * kTile / block_size] : 0; };
    extern __shared__ uint4 shared_ring[];  // [S][W][kVectors][32]
    uint4* ring = shared_ring + warp * kVectors<D> * 32;
    auto stage_of = [&](int stage) { return ring + stage * W * kVectors<D> * 32; };
    // S - 1 tiles in flight ahead of the one computing; a group is committed per tile, empty or not, so
    // "all but the newest S - 2 groups done" always means "the oldest tile is here".
#pragma unroll
    for (int stage = 0; stage < S - 1; ++stage) {
        const int tile_index = warp + stage * W;
        if (tile_index < num_tiles)
            issue_tile<D>(stage_of(stage), cache, block_of(tile_index), kv_head, tile_index * kTile, length, group,
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
            issue_tile<D>(stage_of(refill), cache, pending_block, kv_head, ahead * kTile, length, group, quad, lane);
        commit_copies();
        pending_block = block_after;
        attend_tile(state, current, query_words, scale_log2, tile_index * kTile, length, quad);
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
    for (int index = threadIdx.x; index < group_size * D; index += W * 32) {
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
        output[sequence * stride_output_sequence + (kv_head * group_size + head) * stride_output_head + dim] =
            __float2bfloat16(numerator / denominator);
    }
}

}  // namespace

// The torch entry (`cuda_decode.py` builds this file with torch's extension builder), on the current stream.
torch::Tensor paged_decode(torch::Tensor query, torch::Tensor key_cache, torch::Tensor value_cache,
                           torch::Tensor block_tables, torch::Tensor context_lens, torch::Tensor new_key,
                           torch::Tensor new_value, torch::Tensor write_slots, std::optional<torch::Tensor> row_order,
                           int64_t warps, int64_t stages) {
    const int64_t num_sequences = query.size(0), num_heads = query.size(1), head_dim = query.size(2);
    const int64_t block_size = key_cache.size(1), num_kv_heads = key_cache.size(2);
    TORCH_CHECK(query.scalar_type() == torch::kBFloat16 && key_cache.scalar_type() == torch::kBFloat16 &&
                    value_cache.scalar_type() == torch::kBFloat16 && new_key.scalar_type() == torch::kBFloat16 &&
                    new_value.scalar_type() == torch::kBFloat16,
                "paged_decode (CUDA): bf16 tensors only");
    TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 && context_lens.scalar_type() == torch::kInt32 &&
                    write_slots.scalar_type() == torch::kInt64,
                "paged_decode (CUDA): int32 block tables and context lengths, int64 write slots");
    TORCH_CHECK(head_dim == 64 || head_dim == 128, "paged_decode (CUDA): head dimension 64 or 128, got ", head_dim);
    TORCH_CHECK(block_size % kTile == 0, "paged_decode (CUDA): block size a multiple of 16, got ", block_size);
    const int64_t group_size = num_heads / num_kv_heads;
    TORCH_CHECK(group_size * num_kv_heads == num_heads && group_size <= 8,
                "paged_decode (CUDA): at most 8 query heads per kv head");
    TORCH_CHECK(warps == 4 || warps == 8, "paged_decode (CUDA): 4 or 8 warps");
    TORCH_CHECK(stages >= 2 && stages <= 4, "paged_decode (CUDA): 2 to 4 stages");
    TORCH_CHECK(key_cache.strides() == value_cache.strides(), "paged_decode (CUDA): key and value caches alike");
    for (const torch::Tensor* tensor : {&query, &key_cache, &new_key, &new_value}) {
        // 16-byte vector loads: the head dimension contiguous, every other stride and the start 8-aligned.
        TORCH_CHECK(tensor->stride(-1) == 1 && reinterpret_cast<uintptr_t>(tensor->data_ptr()) % 16 == 0,
                    "paged_decode (CUDA): head dimension contiguous and 16-byte aligned");
        for (int64_t axis = 0; axis + 1 < tensor->dim(); ++axis)
            TORCH_CHECK(tensor->stride(axis) % 8 == 0, "paged_decode (CUDA): strides multiples of 8 elements");
    }
    TORCH_CHECK(reinterpret_cast<uintptr_t>(value_cache.data_ptr()) % 16 == 0, "paged_decode (CUDA): aligned cache");
    auto output = torch::empty({num_sequences, num_heads, head_dim}, query.options());
    if (num_sequences == 0) return output;
    const int* order = row_order.has_value() ? row_order->data_ptr<int>() : nullptr;
    const dim3 grid(static_cast<unsigned>(num_kv_heads), static_cast<unsigned>(num_sequences));
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    const float scale_log2 = static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(head_dim)));
    auto bf16 = [](const torch::Tensor& tensor) { return reinterpret_cast<__nv_bfloat16*>(tensor.data_ptr()); };
    // The ring takes more than the 48 KB a launch gets without asking; raised once per instantiation.
#define ASYNCRL_LAUNCH(D, W, S)                                                                                       \
    do {                                                                                                              \
        constexpr int kRingBytes = S * W * kVectors<D> * 32 * 16;                                                      \
        static const bool raised = [] {                                                                               \
            /* the largest shared-memory carveout, so four CTAs' rings fit on one SM */                            \
            return cudaFuncSetAttribute(paged_decode_kernel<D, W, S>, cudaFuncAttributeMaxDynamicSharedMemorySize,    \
                                        kRingBytes) == cudaSuccess &&                                                 \
                   cudaFuncSetAttribute(paged_decode_kernel<D, W, S>,                                                 \
                                        cudaFuncAttributePreferredSharedMemoryCarveout, 100) == cudaSuccess;          \
        }();                                                                                                          \
        TORCH_CHECK(raised, "paged_decode (CUDA): shared memory for ", S, " stages not granted");                      \
        paged_decode_kernel<D, W, S><<<grid, W * 32, kRingBytes, stream>>>(                                           \
            bf16(query), query.stride(0), query.stride(1), bf16(new_key), new_key.stride(0), new_key.stride(1),       \
            bf16(new_value), new_value.stride(0), new_value.stride(1), write_slots.data_ptr<int64_t>(),               \
            bf16(key_cache), bf16(value_cache), key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),       \
            static_cast<int>(block_size), block_tables.data_ptr<int>(), block_tables.stride(0),                     \
            context_lens.data_ptr<int>(), order, bf16(output), output.stride(0), output.stride(1),                  \
            static_cast<int>(group_size), scale_log2);                                                               \
    } while (false)
#define ASYNCRL_STAGES(D, W)                      \
    if (stages == 2) ASYNCRL_LAUNCH(D, W, 2);     \
    else if (stages == 3) ASYNCRL_LAUNCH(D, W, 3); \
    else ASYNCRL_LAUNCH(D, W, 4)
    if (head_dim == 64 && warps == 4) { ASYNCRL_STAGES(64, 4); }
    else if (head_dim == 64) { ASYNCRL_STAGES(64, 8); }
    else if (warps == 4) { ASYNCRL_STAGES(128, 4); }
    else { ASYNCRL_STAGES(128, 8); }
#undef ASYNCRL_STAGES
#undef ASYNCRL_LAUNCH
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return output;
}
