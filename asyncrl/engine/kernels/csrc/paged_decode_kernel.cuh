// Paged decode attention for bf16 on sm_80+: the kernel and its launcher, free of torch, so that the same code
// serves `paged_decode.cu` (the engine's torch entry, built by `cuda_decode.py`) and a standalone program built
// with plain nvcc in seconds, to check or time a change to the kernel without building a torch extension.
//
// One CTA per (sequence, kv head), W warps. The context is cut into tiles of 16 positions (a tile lies in one
// KV block: the block size is a multiple of 16); warp w takes tiles w, w + W, ... and keeps its own online
// softmax, and the warps' states are merged through shared memory at the end. Each warp streams its tiles
// through its own ring of S shared-memory stages with cp.async: S tiles in flight while it waits, S - 1 while
// it computes one. The step's new key/value go to their slot (the context's last position) from the warp that
// draws the last tile, before it copies that tile; the other warps start streaming at once.
//
// Loads and fragments: a tile's keys and values are copied row by row (every request a whole 128-byte line)
// into the ring, their 16-byte chunks swizzled, and the warp reads mma fragments back with ldmatrix after a
// __syncwarp (each lane reads rows other lanes copied). With mma.m16n8k16 (lane = 4 * group + quad):
//  - S = Q K^T: the query heads are the rows (<= 8 of them: rows 8-15 and a1/a3 stay zero); K's rows are B's
//    columns, so plain ldmatrix of 8 positions x 8 dimensions gives B's fragments.
//  - The C layout of S's two n-tiles (positions 0-7, 8-15) is the A layout of P for P V (k = the 16 positions).
//  - P V: V's rows are B's k, so ldmatrix.trans of 8 positions x 8 dimensions gives B's fragments.

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
    // RoPE's cos/sin (sequences, D) of each sequence's new position, or nullptr: with them, query and new_key
    // arrive before RoPE and the kernel rotates both (out[d] = x[d] cos[d] + rotate_half(x)[d] sin[d], in fp32,
    // rounded once to bf16, as the compiled rotary does), which saves the step a rotary kernel per layer.
    const __nv_bfloat16* cos;
    const __nv_bfloat16* sin;
    int64_t rotary_stride;
    __nv_bfloat16* key_cache;
    __nv_bfloat16* value_cache;
    int64_t stride_block, stride_token, stride_head;
    int block_size;   // a power of two, a multiple of 16
    int block_shift;  // log2(block_size): positions to blocks by shifts, not integer division
    const int* block_tables;  // (sequences, table_width)
    int64_t stride_table;
    int table_width;  // >= 1
    const int* context_lens;  // (sequences,) including the new token
    const int* row_order;     // (sequences,) the order CTAs start in (longest context first), or nullptr
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

__device__ __forceinline__ float2 unpack_bf16(uint32_t word) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&word));
}

// RoPE of two dimensions (one 32-bit word) given their partners D/2 away: x cos - partner sin in the first half
// of the head, x cos + partner sin in the second.
__device__ __forceinline__ uint32_t rotate_words(uint32_t x, uint32_t partner, uint32_t cosines, uint32_t sines,
                                                 bool first_half) {
    const float2 value = unpack_bf16(x), other = unpack_bf16(partner), c = unpack_bf16(cosines),
                 s = unpack_bf16(sines);
    const float sign = first_half ? -1.0f : 1.0f;
    return pack_bf16(value.x * c.x + sign * other.x * s.x, value.y * c.y + sign * other.y * s.y);
}

__device__ __forceinline__ uint4 rotate_chunk(uint4 x, uint4 partner, uint4 cosines, uint4 sines, bool first_half) {
    return make_uint4(rotate_words(x.x, partner.x, cosines.x, sines.x, first_half),
                      rotate_words(x.y, partner.y, cosines.y, sines.y, first_half),
                      rotate_words(x.z, partner.z, cosines.z, sines.z, first_half),
                      rotate_words(x.w, partner.w, cosines.w, sines.w, first_half));
}

// A tile in shared memory: 16 rows (positions) of D bf16 each, keys then values, each row's 16-byte chunks
// swizzled (chunk c of row r sits at c ^ (r % 8)), so that the 8 rows one ldmatrix phase reads hit 8
// different bank groups.
template <int D>
constexpr int kChunks = D / 8;  // 16-byte chunks per row
template <int D>
constexpr int kVectors = 2 * kTile * kChunks<D>;  // 16-byte vectors per tile: keys, then values

// Floats per row of a warp's accumulator in the merge: 8 more than D, so that the 8 rows one warp stores land in
// different banks (2 wavefronts for 8-byte stores) and every row starts 16-byte aligned.
template <int D>
constexpr int kMergeRow = D + 8;
// A warp's merge state in its own first ring slice (kVectors 16-byte vectors): 8 maxima, 8 sums, then the rows.
constexpr int kMergeHeader = 16;
static_assert((kMergeHeader + 8 * kMergeRow<64>) * 4 <= kVectors<64> * 16 &&
                  (kMergeHeader + 8 * kMergeRow<128>) * 4 <= kVectors<128> * 16,
              "a warp's merge state must fit in its slice of the ring");

// Programmatic dependent launch (sm_90): wait until the kernel before this one has finished and its writes are
// visible; let the kernel after this one launch. Both are no-ops for a plain launch, and absent before sm_90.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ int swizzled(int row, int chunk, int chunks) { return row * chunks + (chunk ^ (row & 7)); }

// 16 bytes global -> shared without passing through registers (cp.async, L2 only); `fill` false writes zeros.
__device__ __forceinline__ void copy_async(uint4* destination, const void* source, bool fill) {
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(destination));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(source), "r"(fill ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int Pending>
__device__ __forceinline__ void wait_copies() { asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory"); }

// Four 8x8 bf16 matrices from shared memory, lane l giving the address of row l % 8 of matrix l / 8.
template <bool Transposed>
__device__ __forceinline__ void load_matrices(uint32_t (&words)[4], const uint4* row) {
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row));
    if constexpr (Transposed)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(words[0]), "=r"(words[1]), "=r"(words[2]), "=r"(words[3])
                     : "r"(address)
                     : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(words[0]), "=r"(words[1]), "=r"(words[2]), "=r"(words[3])
                     : "r"(address)
                     : "memory");
}

// A warp's copies of one tile, row by row: one instruction covers 32 / (D/8) whole rows, so every request is a
// whole 128-byte line. Slots past the context may hold anything, NaN included, and 0 x NaN is NaN: their
// values are zero-filled (their keys' scores are masked by position).
template <int D>
__device__ __forceinline__ void issue_tile(uint4* stage, const DecodeParams& p, int block, int kv_head,
                                           int tile_start, int length, int lane) {
    constexpr int kRowsPerCopy = 32 / kChunks<D>;
    const int chunk = lane % kChunks<D>, first_row = lane / kChunks<D>;
    const int64_t base = static_cast<int64_t>(block) * p.stride_block + kv_head * p.stride_head +
                         static_cast<int64_t>(tile_start & (p.block_size - 1)) * p.stride_token + chunk * 8;
#pragma unroll
    for (int i = 0; i < kTile / kRowsPerCopy; ++i) {
        const int row = first_row + i * kRowsPerCopy;
        const int64_t offset = base + row * p.stride_token;
        copy_async(stage + swizzled(row, chunk, kChunks<D>), p.key_cache + offset, true);
        copy_async(stage + kTile * kChunks<D> + swizzled(row, chunk, kChunks<D>), p.value_cache + offset,
                   tile_start + row < length);
    }
}

template <int D>
struct SoftmaxState {
    float running_max = kNegativeLarge;  // of row `group`, in log2 units
    float running_sum = 0.0f;            // this lane's share of row `group`'s sum
    float accumulator[D / 8][4] = {};    // per n-tile j: rows group (0, 1) and 8 + group (2, 3, stay zero)
};

// One tile: S = Q K^T over its 16 positions (two n-tiles of 8), the online softmax, O += P V.
template <int D>
__device__ __forceinline__ void attend_tile(SoftmaxState<D>& state, const uint4* stage,
                                            const uint32_t (&query)[D / 8], float scale_log2, int tile_start,
                                            int length, int lane) {
    const int quad = lane % 4, matrix = lane / 8, matrix_row = lane % 8;
    const uint4* keys = stage;
    const uint4* values = stage + kTile * kChunks<D>;
    float scores[2][4] = {};
#pragma unroll
    for (int step = 0; step < D / 16; ++step) {
        // Matrices: (positions 0-7, dims 16 step ..+8), (0-7, +8..+16), (8-15, ..+8), (8-15, +8..+16).
        uint32_t b[4];
        const int position = 8 * (matrix / 2) + matrix_row;
        load_matrices<false>(b, keys + swizzled(position, 2 * step + matrix % 2, kChunks<D>));
        mma_bf16(scores[0], query[2 * step], query[2 * step + 1], b[0], b[1]);
        mma_bf16(scores[1], query[2 * step], query[2 * step + 1], b[2], b[3]);
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
    for (int pair = 0; pair < D / 16; ++pair) {
        // Transposed matrices: (positions 0-7, dims 16 pair ..+8), (8-15, ..+8), (0-7, +8..+16), (8-15, +8..+16).
        uint32_t b[4];
        const int position = 8 * (matrix % 2) + matrix_row;
        load_matrices<true>(b, values + swizzled(position, 2 * pair + matrix / 2, kChunks<D>));
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            float (&output)[4] = state.accumulator[2 * pair + half];
            output[0] *= correction;
            output[1] *= correction;
            mma_bf16(output, probs_low, probs_high, b[2 * half], b[2 * half + 1]);
        }
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

    const int* table = p.block_tables + sequence * p.stride_table;
    const int num_tiles = (length + kTile - 1) / kTile;
    // The new key/value sit in the context's last tile, and only the warp that draws that tile reads them: that
    // warp stores them (a __syncwarp orders its lanes' stores before its own copies of the tile), so no other warp
    // waits for the store's chain of loads before issuing its first tiles.
    const bool stores_new = warp == (num_tiles - 1) % W;
    const bool new_in_first_tiles = num_tiles - 1 < S * W;  // the store must precede the first issues
    auto store_new = [&] {
        // The new key/value of (sequence, kv head) into its slot, D/8 16-byte vectors each, one per lane; the key
        // rotated first when the launch carries cos/sin (each lane reads its chunk's RoPE partner, D/2 away).
        if (lane < D / 4) {
            const bool is_key = lane < D / 8;
            const int chunk = lane % (D / 8);
            const int64_t slot = p.write_slots[sequence];
            const int64_t offset = (slot >> p.block_shift) * p.stride_block +
                                   (slot & (p.block_size - 1)) * p.stride_token + kv_head * p.stride_head + chunk * 8;
            const __nv_bfloat16* source =
                is_key ? p.new_key + sequence * p.new_key_stride_sequence + kv_head * p.new_key_stride_head
                       : p.new_value + sequence * p.new_value_stride_sequence + kv_head * p.new_value_stride_head;
            uint4 vector = reinterpret_cast<const uint4*>(source)[chunk];
            if (is_key && p.cos != nullptr) {
                constexpr int kHalf = D / 16;  // chunks per half of the head
                const bool first_half = chunk < kHalf;
                const uint4 partner =
                    reinterpret_cast<const uint4*>(source)[first_half ? chunk + kHalf : chunk - kHalf];
                const uint4 cosines = reinterpret_cast<const uint4*>(p.cos + sequence * p.rotary_stride)[chunk];
                const uint4 sines = reinterpret_cast<const uint4*>(p.sin + sequence * p.rotary_stride)[chunk];
                vector = rotate_chunk(vector, partner, cosines, sines, first_half);
            }
            *reinterpret_cast<uint4*>((is_key ? p.key_cache : p.value_cache) + offset) = vector;
        }
        __syncwarp();
    };

    // Block id of a warp's tile, or 0 past the context (never dereferenced).
    auto block_of = [&](int tile_index) {
        return tile_index < num_tiles ? table[(tile_index * kTile) >> p.block_shift] : 0;
    };
    extern __shared__ uint4 shared_ring[];  // [S][W][kVectors]
    uint4* ring = shared_ring + warp * kVectors<D>;
    auto stage_of = [&](int stage) { return ring + stage * W * kVectors<D>; };
    // Every stage in flight at the start; a group is committed per tile, empty or not, so "all but the newest
    // S - 1 groups done" always means "the oldest tile is here". A stage is refilled, S tiles ahead, as soon as
    // its tile has been read.
    // The first tiles' block ids are loaded whether or not the tiles exist (the index clamped into the table's
    // row; an id past the context is never used), so these loads need the sequence but not its length: they and
    // the length arrive together instead of one after the other.
    int first_blocks[S];
#pragma unroll
    for (int stage = 0; stage < S; ++stage)
        first_blocks[stage] = table[min(((warp + stage * W) * kTile) >> p.block_shift, p.table_width - 1)];
    auto issue_first_tiles = [&] {
#pragma unroll
        for (int stage = 0; stage < S; ++stage) {
            const int tile_index = warp + stage * W;
            if (tile_index < num_tiles)
                issue_tile<D>(stage_of(stage), p, first_blocks[stage], kv_head, tile_index * kTile, length, lane);
            commit_copies();
        }
    };
    // Launched as a programmatic dependent launch, the kernel starts while q/k/v's product finishes: the first
    // tiles of the cache, which that product does not write, are requested before the wait, and the query, the
    // new key/value and cos/sin are read after it. The one warp whose first tiles hold the new position stores
    // it before it requests them. Without the launch attribute the wait returns at once.
    const bool stores_first = stores_new && new_in_first_tiles;
    if (!stores_first) issue_first_tiles();
    wait_for_previous_kernel();
    allow_next_kernel();  // o's product may launch as this grid's CTAs leave, and fetch its weights meanwhile
    if (stores_new) store_new();  // when not among the first tiles, its tile is issued in the loop, after this
    if (stores_first) issue_first_tiles();

    // This lane's words of query head `group` as mma's A fragment (zero for the padding rows): k-step s takes
    // dimensions 16 s + 2 quad, +1 and 16 s + 8 + 2 quad, +1.
    uint32_t query_words[D / 8];
    {
        const bool real_head = group < p.group_size;
        const uint32_t* row = reinterpret_cast<const uint32_t*>(
            p.query + sequence * p.query_stride_sequence + (kv_head * p.group_size + group) * p.query_stride_head);
#pragma unroll
        for (int step = 0; step < D / 16; ++step) {
            query_words[2 * step] = real_head ? row[8 * step + quad] : 0u;
            query_words[2 * step + 1] = real_head ? row[8 * step + 4 + quad] : 0u;
        }
    }
    if (p.cos != nullptr) {
        // The query's RoPE, here rather than with its loads: the first tiles' copies are in flight meanwhile,
        // so the cos/sin loads add no latency ahead of them. Word i of the first half (dimensions d, d + 1 <
        // D/2) and word i + D/16 of the second half (d + D/2, d + 1 + D/2) are RoPE partners, and this lane
        // holds both. The padding rows (zeros) stay zero.
        const uint32_t* cosines = reinterpret_cast<const uint32_t*>(p.cos + sequence * p.rotary_stride);
        const uint32_t* sines = reinterpret_cast<const uint32_t*>(p.sin + sequence * p.rotary_stride);
#pragma unroll
        for (int i = 0; i < D / 16; ++i) {
            const int word = 8 * (i / 2) + 4 * (i % 2) + quad;  // index in the row of query_words[i]
            const uint32_t low = query_words[i], high = query_words[i + D / 16];
            query_words[i] = rotate_words(low, high, cosines[word], sines[word], true);
            query_words[i + D / 16] = rotate_words(high, low, cosines[word + D / 4], sines[word + D / 4], false);
        }
    }
    int pending_block = block_of(warp + S * W);
    SoftmaxState<D> state;
    int stage = 0;
    for (int tile_index = warp; tile_index < num_tiles; tile_index += W) {
        wait_copies<S - 1>();
        __syncwarp();  // the oldest tile's rows, copied by every lane, are visible to the whole warp
        attend_tile(state, stage_of(stage), query_words, p.scale_log2, tile_index * kTile, length, lane);
        __syncwarp();  // every lane has read the tile before its stage is refilled
        const int ahead = tile_index + S * W;
        const int block_after = block_of(ahead + W);  // loaded a tile before it is needed
        if (ahead < num_tiles)
            issue_tile<D>(stage_of(stage), p, pending_block, kv_head, ahead * kTile, length, lane);
        commit_copies();
        pending_block = block_after;
        stage = stage + 1 == S ? 0 : stage + 1;
    }
    wait_copies<0>();
    state.running_sum += __shfl_xor_sync(0xffffffff, state.running_sum, 1);
    state.running_sum += __shfl_xor_sync(0xffffffff, state.running_sum, 2);

    // Merge the warps' (max, sum, accumulator) per query head. Each warp leaves its state in its own slice of the
    // ring (its copies are done and read), so one barrier suffices: afterwards each thread merges four dimensions
    // of one head, weighting warp w by exp2(m_w - M) (0 for a warp that drew no tile).
    float* merge = reinterpret_cast<float*>(ring);  // this warp's [8] max, [8] sum, [8][kMergeRow] accumulator
    if (quad == 0) {
        merge[group] = state.running_max;
        merge[8 + group] = state.running_sum;
    }
    float2* row = reinterpret_cast<float2*>(merge + kMergeHeader + group * kMergeRow<D>);
#pragma unroll
    for (int j = 0; j < D / 8; ++j)  // dimensions 8 j + 2 quad and + 1
        row[4 * j + quad] = make_float2(state.accumulator[j][0], state.accumulator[j][1]);
    __syncthreads();
    // Four dimensions per thread: W 16-byte reads, one 8-byte store.
    for (int index = threadIdx.x; index < p.group_size * D / 4; index += W * 32) {
        const int head = index / (D / 4), dim = 4 * (index % (D / 4));
        auto warp_merge = [&](int w) { return reinterpret_cast<const float*>(shared_ring + w * kVectors<D>); };
        float merged_max = kNegativeLarge;
#pragma unroll
        for (int w = 0; w < W; ++w) merged_max = fmaxf(merged_max, warp_merge(w)[head]);
        float denominator = 0.0f;
        float4 total = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int w = 0; w < W; ++w) {
            const float* other = warp_merge(w);
            const float weight = fast_exp2(other[head] - merged_max);
            denominator += weight * other[8 + head];
            const float4 part = *reinterpret_cast<const float4*>(other + kMergeHeader + head * kMergeRow<D> + dim);
            total.x += weight * part.x;
            total.y += weight * part.y;
            total.z += weight * part.z;
            total.w += weight * part.w;
        }
        const float inverse = 1.0f / denominator;
        *reinterpret_cast<uint2*>(p.output + sequence * p.output_stride_sequence +
                                  (kv_head * p.group_size + head) * p.output_stride_head + dim) =
            make_uint2(pack_bf16(total.x * inverse, total.y * inverse), pack_bf16(total.z * inverse, total.w * inverse));
    }
}

template <int D, int W, int S>
constexpr int kRingBytes = S * W * kVectors<D> * 16;

template <int D, int W, int S>
cudaError_t launch_with(const DecodeParams& params, bool programmatic, cudaStream_t stream) {
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
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(params.num_kv_heads), static_cast<unsigned>(params.num_sequences));
    config.blockDim = dim3(W * 32);
    config.dynamicSmemBytes = kRingBytes<D, W, S>;
    config.stream = stream;
    cudaLaunchAttribute attribute = {};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &attribute;
    config.numAttrs = programmatic ? 1 : 0;
    return cudaLaunchKernelEx(&config, paged_decode_kernel<D, W, S>, params);
}

template <int D, int W>
cudaError_t launch_with_stages(const DecodeParams& params, int stages, bool programmatic, cudaStream_t stream) {
    switch (stages) {
        case 2: return launch_with<D, W, 2>(params, programmatic, stream);
        case 3: return launch_with<D, W, 3>(params, programmatic, stream);
        case 4: return launch_with<D, W, 4>(params, programmatic, stream);
        default: return cudaErrorInvalidValue;
    }
}

// Head dimension 64 or 128, 4 or 8 warps, 2-4 stages; anything else is cudaErrorInvalidValue, as is a ring
// larger than an SM's shared memory (cudaFuncSetAttribute's answer). `programmatic`: a programmatic dependent
// launch, which reads the cache before the kernel before it has finished, so that kernel must not write the cache
// (the engine's q/k/v product does not); false for a caller that just wrote the cache.
inline cudaError_t launch_paged_decode(const DecodeParams& params, int head_dim, int warps, int stages,
                                       bool programmatic, cudaStream_t stream) {
    if (params.num_sequences == 0) return cudaSuccess;
    if (head_dim == 64 && warps == 4) return launch_with_stages<64, 4>(params, stages, programmatic, stream);
    if (head_dim == 64 && warps == 8) return launch_with_stages<64, 8>(params, stages, programmatic, stream);
    if (head_dim == 128 && warps == 4) return launch_with_stages<128, 4>(params, stages, programmatic, stream);
    if (head_dim == 128 && warps == 8) return launch_with_stages<128, 8>(params, stages, programmatic, stream);
    return cudaErrorInvalidValue;
}

}  // namespace asyncrl_decode
