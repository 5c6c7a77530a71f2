// The engine's CUDA decode-attention kernel (asyncrl/engine/csrc/paged_decode_kernel.cuh) checked and timed
// without torch: built here with plain nvcc in seconds, carried to the GPU machine as a binary, so a device
// call spends its time measuring, not building a torch extension.
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -I asyncrl/engine/csrc \
//        -o .devbuild/decode_attention_harness benchmarks/csrc/decode_attention_harness.cu
//   .devbuild/decode_attention_harness check            # fp32 reference on the host, both head shapes
//   .devbuild/decode_attention_harness time 64 4,8 2,3  # head dim, warps, stages: us per layer and TB/s
//   .devbuild/decode_attention_harness sweep            # 0.5B's launch at three mean contexts: fixed + slope
//   .devbuild/decode_attention_harness floor [once]     # 0.5B's launch at one tile per CTA: a launch's own cost
//   .devbuild/decode_attention_harness once 64 4 3      # one launch (under ncu or compute-sanitizer)
//   .devbuild/decode_attention_harness probe            # which SM each CTA of the 0.5B grid runs on
//
// The timed case is `benchmarks/tune_decode_attention.py`'s: 256 sequences, contexts uniform in 640-1,536,
// longest first, blocks of 16 positions shuffled over the cache, 24 layers of distinct caches (so the KV comes
// from HBM, not L2), the new key/value stored by the kernel, launches replayed from one CUDA graph.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "decode_attention_case.cuh"
#include "harness_timing.cuh"
#include "paged_decode_kernel.cuh"

using asyncrl_decode::DecodeParams;


using namespace attention_case;

namespace {

// Largest relative error (per query head row) against fp32 attention over each context alone, after the
// kernel ran once on a cache whose slots past every context hold NaN; also whether the new K/V were stored.
bool check(Shape shape, int warps, int stages) {
    const std::vector<int> lengths = {1, 2, 15, 16, 17, 31, 32, 33, 100, 129, 1000, 2047};
    Case c = make_case(shape, lengths, 1, 7 + shape.head_dim + warps * 10 + stages);
    const int d = shape.head_dim, group = shape.heads / kKvHeads;
    // NaN in every slot past a context, in the context's own blocks.
    std::vector<__nv_bfloat16> keys = download(c.key_caches[0], c.cache_elements());
    std::vector<__nv_bfloat16> values = download(c.value_caches[0], c.cache_elements());
    const uint16_t nan_bits = 0x7FC0;
    __nv_bfloat16 nan_value;
    std::memcpy(&nan_value, &nan_bits, 2);
    // NaN too in each context's last slot, where the kernel stores the new key/value: reading that slot back
    // from the cache instead of using the new row would show.
    for (int s = 0; s < c.sequences; ++s)
        for (int position = lengths[s] - 1; position < c.width * kBlockSize; ++position)
            for (int e = 0; e < kKvHeads * d; ++e) {
                const int64_t index = c.slot(s, position) * kKvHeads * d + e;
                keys[index] = nan_value;
                values[index] = nan_value;
            }
    CHECK_CUDA(cudaMemcpy(c.key_caches[0], keys.data(), keys.size() * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(c.value_caches[0], values.data(), values.size() * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(c.output, 0xFF, static_cast<int64_t>(c.sequences) * shape.heads * d * 2));  // NaN poison
    CHECK_CUDA(asyncrl_decode::launch_paged_decode(c.params(0), d, warps, stages, false, nullptr));
    CHECK_CUDA(cudaDeviceSynchronize());
    keys = download(c.key_caches[0], c.cache_elements());
    values = download(c.value_caches[0], c.cache_elements());
    const int64_t qkv_row = (shape.heads + 2 * kKvHeads) * d;
    const std::vector<__nv_bfloat16> qkv = download(c.query, static_cast<int64_t>(c.sequences) * qkv_row);
    const std::vector<__nv_bfloat16> output = download(c.output, static_cast<int64_t>(c.sequences) * shape.heads * d);
    bool stored = true;
    double worst = 0.0;
    for (int s = 0; s < c.sequences; ++s) {
        for (int e = 0; e < kKvHeads * d; ++e) {
            const int64_t slot_index = c.slots[s] * kKvHeads * d + e;
            stored &= bf16_to_float(keys[slot_index]) == bf16_to_float(qkv[s * qkv_row + shape.heads * d + e]);
            stored &= bf16_to_float(values[slot_index]) ==
                      bf16_to_float(qkv[s * qkv_row + (shape.heads + kKvHeads) * d + e]);
        }
        for (int head = 0; head < shape.heads; ++head) {
            const int kv_head = head / group;
            std::vector<double> scores(lengths[s]);
            double top = -1e300;
            for (int position = 0; position < lengths[s]; ++position) {
                const int64_t row = c.slot(s, position) * kKvHeads * d + kv_head * d;
                double dot = 0.0;
                for (int e = 0; e < d; ++e)
                    dot += bf16_to_float(qkv[s * qkv_row + head * d + e]) * bf16_to_float(keys[row + e]);
                scores[position] = dot / std::sqrt(static_cast<double>(d));
                top = std::max(top, scores[position]);
            }
            double total = 0.0;
            for (double& score : scores) total += (score = std::exp(score - top));
            double error = 0.0, norm = 0.0;
            for (int e = 0; e < d; ++e) {
                double expected = 0.0;
                for (int position = 0; position < lengths[s]; ++position) {
                    const int64_t row = c.slot(s, position) * kKvHeads * d + kv_head * d;
                    expected += scores[position] / total * bf16_to_float(values[row + e]);
                }
                const double got = bf16_to_float(output[(static_cast<int64_t>(s) * shape.heads + head) * d + e]);
                error += (got - expected) * (got - expected);
                norm += expected * expected;
            }
            const double relative = std::sqrt(error / norm);
            worst = std::isnan(relative) ? INFINITY : std::max(worst, relative);
        }
    }
    const bool passed = stored && worst < 1e-2;
    std::printf("check head_dim %d warps %d stages %d: max relative error %.2e, new K/V stored %s: %s\n", d, warps,
                stages, worst, stored ? "yes" : "NO", passed ? "ok" : "FAILED");
    return passed;
}

// 256 contexts uniform in [shortest, shortest + spread]; the default spread is the bench's (prompts 128-1,024).
std::vector<int> timed_lengths(uint64_t seed, int shortest = 640, int spread = 896) {
    std::vector<int> lengths(256);
    uint64_t state = seed;
    for (int& length : lengths) length = shortest + static_cast<int>(next_random(state) % (spread + 1));
    return lengths;
}

// Median microseconds per launch: `layers` launches (one per layer's cache) in one graph, replayed; `programmatic`:
// each a programmatic dependent launch, so that a launch fetches its first tiles while the one before finishes.
double time_launches(const Case& c, int warps, int stages, int layers, int replays, bool programmatic = false) {
    const double milliseconds = graph_median_ms(
        [&](cudaStream_t stream) {
            for (int layer = 0; layer < layers; ++layer)
                CHECK_CUDA(asyncrl_decode::launch_paged_decode(c.params(layer), c.shape.head_dim, warps, stages,
                                                               programmatic, stream));
        },
        replays);
    return milliseconds * 1e3 / layers;
}

std::vector<int> parse_list(const char* text) {
    std::vector<int> values;
    for (const char* cursor = text; *cursor;) {
        values.push_back(std::atoi(cursor));
        while (*cursor && *cursor != ',') ++cursor;
        if (*cursor == ',') ++cursor;
    }
    return values;
}

// Which SM each CTA of a (kv heads, sequences) grid runs on, with the kernel's resources (4 warps, a 48 KB
// ring): every CTA spins until all have started, so the whole grid is resident at once.
__global__ void probe_placement(int* sm_of_block, int* started, int total) {
    extern __shared__ uint4 unused[];
    if (threadIdx.x == 0) {
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        sm_of_block[blockIdx.y * gridDim.x + blockIdx.x] = static_cast<int>(sm);
        atomicAdd(started, 1);
        const long long deadline = clock64() + 200000000LL;  // ~0.1 s: never hang if the grid cannot all fit
        while (atomicAdd(started, 0) < total && clock64() < deadline) {
        }
        unused[0] = make_uint4(sm, 0, 0, 0);
    }
}

void probe(int sequences, int shared_bytes) {
    int *sm_of_block = nullptr, *started = nullptr;
    const int total = 2 * sequences;
    CHECK_CUDA(cudaMalloc(&sm_of_block, total * 4));
    CHECK_CUDA(cudaMalloc(&started, 4));
    CHECK_CUDA(cudaMemset(started, 0, 4));
    CHECK_CUDA(cudaFuncSetAttribute(probe_placement, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
    probe_placement<<<dim3(2, sequences), 128, shared_bytes>>>(sm_of_block, started, total);
    CHECK_CUDA(cudaDeviceSynchronize());
    const std::vector<int> sms = download(sm_of_block, total);
    int sm_count = 0;
    CHECK_CUDA(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
    int matches = 0;
    for (int b = 0; b < total; ++b) matches += sms[b] == sms[b % sm_count];
    std::printf("probe: %d SMs; linear block b on the SM of block b %% %d for %d of %d blocks; first 140:", sm_count,
                sm_count, matches, total);
    for (int b = 0; b < std::min(total, 140); ++b) std::printf(" %d", sms[b]);
    std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "check";
    if (mode == "probe") {
        probe(256, 48 * 1024);
        return 0;
    }
    if (mode == "check") {
        bool passed = true;
        for (int head_dim : {64, 128})
            for (auto [warps, stages] : {std::pair{4, 2}, std::pair{4, 3}, std::pair{8, 3}})
                passed &= check(shape_of(head_dim), warps, stages);
        return passed ? 0 : 1;
    }
    if (mode == "sweep") {
        // The kernel's fixed and per-position cost: 0.5B's engine launch (64 x 4 x 3, RoPE folded in) at three
        // mean contexts; the slope between them is the streaming rate, the intercept the cost of a launch. Then
        // equal contexts: one tile each (a launch's start and end alone), and the middle mean without spread.
        for (auto [shortest, spread] : {std::pair{128, 896}, std::pair{640, 896}, std::pair{1152, 896},
                                        std::pair{16, 0}, std::pair{1088, 0}}) {
            Case c = make_case(shape_of(64), timed_lengths(1, shortest, spread), 24, 1);
            add_rotary(c);
            const double mean = std::accumulate(c.lengths.begin(), c.lengths.end(), 0.0) / c.sequences;
            for (bool programmatic : {false, true}) {
                const double microseconds = time_launches(c, 4, 3, 24, 50, programmatic);
                std::printf("sweep contexts %4d-%4d, mean %6.1f%s: %6.2f us per layer, %5.2f TB/s of KV\n", shortest,
                            shortest + spread, mean, programmatic ? ", programmatic" : "", microseconds,
                            c.kv_bytes / microseconds / 1e6);
            }
        }
        return 0;
    }
    if (mode == "floor") {
        // A launch's own cost: 0.5B's grid with one 16-position tile per CTA (RoPE in the kernel), timed at each
        // warps x stages (the ring's size changes), or launched once for a profiler ("floor once").
        const bool once = argc > 2 && std::string(argv[2]) == "once";
        Case c = make_case(shape_of(64), timed_lengths(1, 16, 0), once ? 1 : 24, 1);
        add_rotary(c);
        if (once) {
            CHECK_CUDA(asyncrl_decode::launch_paged_decode(c.params(0), 64, 4, 3, false, nullptr));
            CHECK_CUDA(cudaDeviceSynchronize());
            std::printf("floor once: launched\n");
            return 0;
        }
        for (int w : {4, 8})
            for (int s : {2, 3, 4})
                std::printf("floor warps %d stages %d: %5.2f us per launch\n", w, s, time_launches(c, w, s, 24, 50));
        return 0;
    }
    const int head_dim = argc > 2 ? std::atoi(argv[2]) : 64;
    const std::vector<int> warps = parse_list(argc > 3 ? argv[3] : "4");
    const std::vector<int> stages = parse_list(argc > 4 ? argv[4] : "3");
    const int layers = mode == "once" ? 1 : 24;
    Case c = make_case(shape_of(head_dim), timed_lengths(1), layers, 1);
    // "time 64 4 3 rotary": the same launches with RoPE folded into the kernel (cos/sin random, the cost is the same).
    const bool rotate = argc > 5 && std::string(argv[5]) == "rotary";
    if (rotate) add_rotary(c);
    for (int w : warps)
        for (int s : stages) {
            if (mode == "once") {
                CHECK_CUDA(asyncrl_decode::launch_paged_decode(c.params(0), head_dim, w, s, false, nullptr));
                CHECK_CUDA(cudaDeviceSynchronize());
                std::printf("once head_dim %d warps %d stages %d: launched\n", head_dim, w, s);
                continue;
            }
            const double microseconds = time_launches(c, w, s, layers, 50);
            std::printf("time head_dim %d warps %d stages %d%s: %6.1f us per layer, %5.2f TB/s of KV\n", head_dim, w,
                        s, rotate ? " rotary" : "", microseconds, c.kv_bytes / microseconds / 1e6);
        }
    return 0;
}
