// One decode-attention case for the harnesses (decode_attention_harness.cu, fused_layer_harness.cu): 256-style
// batches of sequences with their contexts' blocks shuffled over per-layer caches, the step's q/k/v as strided views
// of one projection output, block tables, slots and row order on the device, and their host copies for checking.

#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "harness_timing.cuh"
#include "paged_decode_kernel.cuh"

namespace attention_case {

using asyncrl_decode::DecodeParams;

constexpr int kBlockSize = 16;
constexpr int kKvHeads = 2;

struct Shape {
    int heads, head_dim;  // Qwen2.5-0.5B: 14 x 64, 1.5B: 12 x 128, both over 2 kv heads
};

inline Shape shape_of(int head_dim) { return head_dim == 64 ? Shape{14, 64} : Shape{12, 128}; }

__host__ __device__ inline uint64_t next_random(uint64_t& state) {  // splitmix64
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Normal-ish bf16 noise on the device (sum of two uniforms), so gigabytes of cache need no host copy.
__global__ void fill_noise(__nv_bfloat16* data, int64_t count, uint64_t seed) {
    for (int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; index < count;
         index += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        uint64_t state = seed ^ (static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull);
        const uint64_t bits = next_random(state);
        const float a = static_cast<float>(bits & 0xFFFFFF) / 16777216.0f;
        const float b = static_cast<float>((bits >> 24) & 0xFFFFFF) / 16777216.0f;
        data[index] = __float2bfloat16((a + b - 1.0f) * 2.45f);
    }
}

// One layer's case: caches, tables and step inputs on the device, and their host copies for checking.
struct Case {
    Shape shape;
    int sequences = 0, width = 0, num_blocks = 0;
    std::vector<int> lengths, tables, order;
    std::vector<int64_t> slots;
    int64_t kv_bytes = 0;  // bytes of K and V one launch attends to
    __nv_bfloat16 *query = nullptr, *new_key = nullptr, *new_value = nullptr, *output = nullptr;
    std::vector<__nv_bfloat16*> key_caches, value_caches;  // one per layer
    int *tables_device = nullptr, *lengths_device = nullptr, *order_device = nullptr;
    int64_t* slots_device = nullptr;
    // RoPE's cos and sin (sequences, D) each, back to back; `rotate` hands them to the kernel, which then rotates
    // the query and the new key itself (the engine's CUDA decode path).
    __nv_bfloat16* rotary = nullptr;
    bool rotate = false;

    int64_t cache_elements() const { return static_cast<int64_t>(num_blocks) * kBlockSize * kKvHeads * shape.head_dim; }

    // The flat cache slot (block * block_size + offset) of a sequence's position, through its block table.
    int64_t slot(int sequence, int position) const {
        return static_cast<int64_t>(tables[sequence * width + position / kBlockSize]) * kBlockSize + position % kBlockSize;
    }

    DecodeParams params(int layer) const {
        DecodeParams p{};
        const int64_t d = shape.head_dim, qkv_row = (shape.heads + 2 * kKvHeads) * d;
        p.query = query;  // q, k, v as strided views of one projection output, as the engine passes them
        p.query_stride_sequence = qkv_row;
        p.query_stride_head = d;
        p.new_key = new_key;
        p.new_key_stride_sequence = qkv_row;
        p.new_key_stride_head = d;
        p.new_value = new_value;
        p.new_value_stride_sequence = qkv_row;
        p.new_value_stride_head = d;
        p.write_slots = slots_device;
        p.key_cache = key_caches[layer];
        p.value_cache = value_caches[layer];
        p.stride_block = kBlockSize * kKvHeads * d;
        p.stride_token = kKvHeads * d;
        p.stride_head = d;
        p.block_size = kBlockSize;
        p.block_shift = __builtin_ctz(kBlockSize);  // kBlockSize is a power of two
        p.block_tables = tables_device;
        p.stride_table = width;
        p.table_width = width;
        p.context_lens = lengths_device;
        p.row_order = order_device;
        p.output = output;
        p.output_stride_sequence = shape.heads * d;
        p.output_stride_head = d;
        p.num_sequences = sequences;
        p.num_kv_heads = kKvHeads;
        p.group_size = shape.heads / kKvHeads;
        p.scale_log2 = static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(d)));
        if (rotate) {
            p.cos = rotary;
            p.sin = rotary + static_cast<int64_t>(sequences) * d;
            p.rotary_stride = d;
        }
        return p;
    }
};

// Random cos/sin for every sequence, handed to the kernel, which then rotates the query and the new key itself (the
// engine's CUDA decode path; random values cost the same as real ones).
inline void add_rotary(Case& c) {
    const int64_t count = 2 * static_cast<int64_t>(c.sequences) * c.shape.head_dim;
    CHECK_CUDA(cudaMalloc(&c.rotary, count * sizeof(__nv_bfloat16)));
    fill_noise<<<64, 256>>>(c.rotary, count, 99);
    CHECK_CUDA(cudaGetLastError());
    c.rotate = true;
}

template <typename T>
inline T* upload(const std::vector<T>& host) {
    T* device = nullptr;
    CHECK_CUDA(cudaMalloc(&device, host.size() * sizeof(T)));
    CHECK_CUDA(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    return device;
}

// The order the sequences' CTAs start in: longest context first (the engine's), or, with HARNESS_ROW_ORDER set
// (harness experiments only), "random", "interleave" (longest, shortest, second longest, ...) or "snake" (longest
// first, every other run of 66 reversed).
inline std::vector<int> row_order(const std::vector<int>& lengths, uint64_t& state) {
    std::vector<int> order(lengths.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return lengths[a] > lengths[b]; });
    const char* kind = std::getenv("HARNESS_ROW_ORDER");
    const std::string name = kind != nullptr ? kind : "longest";
    if (name == "random") {
        for (size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[next_random(state) % (i + 1)]);
    } else if (name == "interleave") {
        std::vector<int> mixed;
        for (size_t low = 0, high = order.size(); low < high;) {
            mixed.push_back(order[low++]);
            if (low < high) mixed.push_back(order[--high]);
        }
        order = mixed;
    } else if (name == "stratified") {  // ranks in bit-reversed counting: every prefix samples all lengths
        int bits = 0;
        while ((size_t{1} << bits) < order.size()) ++bits;
        std::vector<int> spread;
        for (size_t i = 0; i < (size_t{1} << bits); ++i) {
            size_t reversed = 0;
            for (int b = 0; b < bits; ++b) reversed |= ((i >> b) & 1) << (bits - 1 - b);
            if (reversed < order.size()) spread.push_back(order[reversed]);
        }
        order = spread;
    } else if (name == "snake") {
        for (size_t start = 66; start < order.size(); start += 132)
            std::reverse(order.begin() + start, order.begin() + std::min(order.size(), start + 66));
    }
    return order;
}

inline Case make_case(Shape shape, const std::vector<int>& lengths, int layers, uint64_t seed) {
    Case c;
    c.shape = shape;
    c.sequences = static_cast<int>(lengths.size());
    c.lengths = lengths;
    const int longest = *std::max_element(lengths.begin(), lengths.end());
    c.width = (longest + kBlockSize - 1) / kBlockSize;
    c.num_blocks = c.sequences * c.width;
    std::vector<int> permutation(c.num_blocks);
    std::iota(permutation.begin(), permutation.end(), 0);
    uint64_t state = seed;
    for (int i = c.num_blocks - 1; i > 0; --i) std::swap(permutation[i], permutation[next_random(state) % (i + 1)]);
    c.tables = permutation;  // row s holds blocks permutation[s * width ...]: scattered over the cache
    for (int s = 0; s < c.sequences; ++s) {
        c.slots.push_back(c.slot(s, lengths[s] - 1));
        c.kv_bytes += static_cast<int64_t>(lengths[s]) * kKvHeads * shape.head_dim * 2 * 2;
    }
    c.order = row_order(lengths, state);
    const int64_t qkv_elements = static_cast<int64_t>(c.sequences) * (shape.heads + 2 * kKvHeads) * shape.head_dim;
    __nv_bfloat16* qkv = nullptr;
    CHECK_CUDA(cudaMalloc(&qkv, qkv_elements * 2));
    fill_noise<<<1024, 256>>>(qkv, qkv_elements, next_random(state));
    c.query = qkv;
    c.new_key = qkv + shape.heads * shape.head_dim;
    c.new_value = qkv + (shape.heads + kKvHeads) * shape.head_dim;
    CHECK_CUDA(cudaMalloc(&c.output, static_cast<int64_t>(c.sequences) * shape.heads * shape.head_dim * 2));
    for (int layer = 0; layer < layers; ++layer) {
        __nv_bfloat16 *keys = nullptr, *values = nullptr;
        CHECK_CUDA(cudaMalloc(&keys, c.cache_elements() * 2));
        CHECK_CUDA(cudaMalloc(&values, c.cache_elements() * 2));
        fill_noise<<<4096, 256>>>(keys, c.cache_elements(), next_random(state));
        fill_noise<<<4096, 256>>>(values, c.cache_elements(), next_random(state));
        c.key_caches.push_back(keys);
        c.value_caches.push_back(values);
    }
    c.tables_device = upload(c.tables);
    c.lengths_device = upload(c.lengths);
    c.order_device = upload(c.order);
    c.slots_device = upload(c.slots);
    CHECK_CUDA(cudaDeviceSynchronize());
    return c;
}

inline float bf16_to_float(__nv_bfloat16 value) {
    uint16_t bits;
    std::memcpy(&bits, &value, 2);
    const uint32_t widened = static_cast<uint32_t>(bits) << 16;
    float result;
    std::memcpy(&result, &widened, 4);
    return result;
}

template <typename T>
std::vector<T> download(const T* device, int64_t count) {
    std::vector<T> host(count);
    CHECK_CUDA(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
}


}  // namespace attention_case
