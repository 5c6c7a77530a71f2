// The engine's Gumbel-max sampler on CUDA: the same race as the Triton kernel (`triton_sampler.py`) and the torch
// reference (`sampler.sample_reference`), in fewer instructions per logit. `cuda_sampler.py` builds it with torch's
// extension builder and calls `gumbel_sample` on the current stream.
//
// Why not Triton's: the sampler is bound by instructions, not by reading the logits. Triton's kernel spends ~58
// instructions per logit (its loop's SASS for sm_90: 233 instructions per 4 logits), ~82 us for 256 x 151,936 bf16
// logits, where reading them takes ~18 us. Here a thread reads 8 logits per 16-byte load, keeps one running state
// for them, and the noise of a greedy row is not computed at all: ~31 instructions per logit.
//
// Per (row, vocabulary split), each thread keeps, over its logits x in vocabulary order (s = x / T):
// - the running max m of s and sum of exp(s - m), with one exponential per logit: d = exp(-|s - m|) is the new term
//   under the old max, or the old max's decay when s is the new max;
// - the race's best candidate: argmax exp(s - m) / E, E = -log2(u) the logit's exponential noise (u from the
//   request's counter hash), which is argmax s + Gumbel up to one constant; fractions compare by cross products,
//   strictly, so within a thread the lower id wins a tie. Greedy rows (T = 0) race with E = 1: the argmax, first
//   id on ties. Logits under the row's truncation threshold (top-k / top-p, raw logits) take no part in the race.
// The threads are merged into the split's (max, sum, best score, its scaled logit, its id), and the splits per row
// by a second kernel into the token and its log-prob: log_softmax(x / T) over the full vocabulary.

#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <torch/extension.h>

#include <cstdint>
#include <string>
#include <tuple>

namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 8;                      // logits per thread per load
constexpr float kNegativeLarge = -1.0e30f;     // a finite -inf: exp(kNegativeLarge - m) is 0 without inf - inf
constexpr float kLog2E = 1.4426950408889634f;
constexpr uint32_t kGolden = 0x9E3779B9u;      // sampler.GOLDEN32
constexpr float kNoiseFloor = 8.5e-8f;         // just under -log2(1 - 2^-24) = 8.599e-8

__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float log2_approx(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// murmur3's fmix32, as `sampler.mix_32`.
__device__ __forceinline__ uint32_t mix_32(uint32_t h) {
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    return h ^ (h >> 16);
}

// A vocabulary id's race noise E = -log2(u), u = ((bits >> 9) + 0.5) 2^-23 from the row's key, as
// `sampler.uniform_from_bits` (exact: (bits >> 9) 2^-23 + 2^-24 is that sum scaled by a power of two, 24 bits).
// Never below the exact noise of the largest u, -log2(1 - 2^-24): CUDA bounds the approximate log2's absolute error
// only (~2^-22), which would allow a zero or negative noise next to 1, a certain win. On an H200 it is never >= 0,
// but for the largest u it is 86% low, which the floor lifts to within 1.2% (probed at u = 1 - j 2^-24, j < 4096).
__device__ __forceinline__ float race_noise(uint32_t key, uint32_t vocab_id) {
    const uint32_t bits = mix_32(key + vocab_id * kGolden);
    return fmaxf(-log2_approx(fmaf(static_cast<float>(bits >> 9), 1.1920928955078125e-07f, 5.9604644775390625e-08f)),
                 kNoiseFloor);
}

struct Lane {
    float max = kNegativeLarge, sum = 0.0f;
    float weight = -1.0f, noise = 1.0f;  // the best candidate's exp(s - max) (negative: none yet) and its noise
    int index = 0;
};

template <bool GREEDY, bool TRUNCATED>
__device__ __forceinline__ void take(Lane& lane, float x, float inverse_temperature, float threshold, uint32_t key,
                                     int vocab_id) {
    const float scaled = x * inverse_temperature;
    const bool is_new_max = scaled > lane.max;
    const float decay = exp2_approx(-fabsf(scaled - lane.max) * kLog2E);
    lane.sum = is_new_max ? fmaf(lane.sum, decay, 1.0f) : lane.sum + decay;
    lane.weight = is_new_max ? lane.weight * decay : lane.weight;  // rescaled to the new max
    lane.max = fmaxf(lane.max, scaled);
    const float weight = is_new_max ? 1.0f : decay;
    const float noise = GREEDY ? 1.0f : race_noise(key, static_cast<uint32_t>(vocab_id));
    bool is_better = weight * lane.noise > lane.weight * noise;
    if (TRUNCATED) is_better = is_better && x >= threshold;
    lane.weight = is_better ? weight : lane.weight;
    lane.noise = is_better ? noise : lane.noise;
    lane.index = is_better ? vocab_id : lane.index;
}

__device__ __forceinline__ void widen(const __nv_bfloat16* source, float (&values)[kChunk]) {
    const uint4 raw = *reinterpret_cast<const uint4*>(source);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        values[2 * w] = __uint_as_float(words[w] << 16);
        values[2 * w + 1] = __uint_as_float(words[w] & 0xFFFF0000u);
    }
}

__device__ __forceinline__ void widen(const float* source, float (&values)[kChunk]) {
    const float4 low = reinterpret_cast<const float4*>(source)[0], high = reinterpret_cast<const float4*>(source)[1];
    values[0] = low.x, values[1] = low.y, values[2] = low.z, values[3] = low.w;
    values[4] = high.x, values[5] = high.y, values[6] = high.z, values[7] = high.w;
}

__device__ __forceinline__ float widen(__nv_bfloat16 value) { return __bfloat162float(value); }
__device__ __forceinline__ float widen(float value) { return value; }

template <bool GREEDY, bool TRUNCATED, typename T>
__device__ __forceinline__ void run_split(Lane& lane, const T* row, int first_chunk, int stop_chunk,
                                          float inverse_temperature, float threshold, uint32_t key) {
    for (int chunk = first_chunk + static_cast<int>(threadIdx.x); chunk < stop_chunk; chunk += kThreads) {
        float values[kChunk];
        widen(row + chunk * kChunk, values);
#pragma unroll
        for (int i = 0; i < kChunk; ++i)
            take<GREEDY, TRUNCATED>(lane, values[i], inverse_temperature, threshold, key, chunk * kChunk + i);
    }
}

// Two partial states merged: max and rescaled sums; the better candidate by score, the lower id on a tie.
struct Partial {
    float max, sum, score;
    int index;
};

__device__ __forceinline__ Partial merge(const Partial& a, const Partial& b) {
    const float max = fmaxf(a.max, b.max);
    const float sum = a.sum * __expf(a.max - max) + b.sum * __expf(b.max - max);
    const bool b_wins = b.score > a.score || (b.score == a.score && b.index < a.index);
    return {max, sum, b_wins ? b.score : a.score, b_wins ? b.index : a.index};
}

__device__ __forceinline__ Partial shuffle_down(const Partial& p, int offset) {
    return {__shfl_down_sync(0xFFFFFFFFu, p.max, offset), __shfl_down_sync(0xFFFFFFFFu, p.sum, offset),
            __shfl_down_sync(0xFFFFFFFFu, p.score, offset), __shfl_down_sync(0xFFFFFFFFu, p.index, offset)};
}

// One (split, row): its max, sum under that max, best score (log(weight / noise) + max: the race's s + Gumbel up to
// one constant shared by every row and split), that candidate's scaled logit and id.
template <typename T>
__global__ void __launch_bounds__(kThreads) race_splits(const T* logits, int64_t stride, int vocab_size,
                                                        int split_chunks, const float* temperatures,
                                                        const float* thresholds, const int64_t* keys,
                                                        float* partial_max, float* partial_sum, float* partial_score,
                                                        float* partial_scaled, int64_t* partial_index) {
    const int split = blockIdx.x, row = blockIdx.y, num_splits = gridDim.x;
    const T* row_logits = logits + row * stride;
    const float temperature = temperatures[row], threshold = thresholds[row];
    const bool greedy = temperature == 0.0f, truncated = threshold > -INFINITY;
    const float inverse_temperature = greedy ? 1.0f : __frcp_rn(temperature);
    const uint32_t key = static_cast<uint32_t>(keys[row]);
    const int first_chunk = split * split_chunks;
    const int stop_chunk = min(first_chunk + split_chunks, vocab_size / kChunk);
    Lane lane;
    if (greedy)
        truncated ? run_split<true, true>(lane, row_logits, first_chunk, stop_chunk, 1.0f, threshold, key)
                  : run_split<true, false>(lane, row_logits, first_chunk, stop_chunk, 1.0f, threshold, key);
    else
        truncated ? run_split<false, true>(lane, row_logits, first_chunk, stop_chunk, inverse_temperature, threshold, key)
                  : run_split<false, false>(lane, row_logits, first_chunk, stop_chunk, inverse_temperature, threshold,
                                            key);
    Partial partial{lane.max, lane.sum,
                    lane.weight > 0.0f ? logf(fmaxf(lane.weight / lane.noise, 1e-30f)) + lane.max : -INFINITY,
                    lane.weight > 0.0f ? lane.index : vocab_size};
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) partial = merge(partial, shuffle_down(partial, offset));
    __shared__ Partial warps[kThreads / 32];
    const int warp = threadIdx.x / 32, lane_id = threadIdx.x % 32;
    if (lane_id == 0) warps[warp] = partial;
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int w = 1; w < kThreads / 32; ++w) partial = merge(partial, warps[w]);
    const int best_index = min(partial.index, vocab_size - 1);  // a split with no candidate: any id, score -inf
    const int slot = row * num_splits + split;
    partial_max[slot] = partial.max;
    partial_sum[slot] = partial.sum;
    partial_score[slot] = partial.score;
    partial_scaled[slot] = widen(row_logits[best_index]) * inverse_temperature;
    partial_index[slot] = best_index;
}

// One row (a warp): its splits merged into the token (the best score, the first split on a tie) and its log-prob.
__global__ void merge_splits(int num_splits, const float* partial_max, const float* partial_sum,
                             const float* partial_score, const float* partial_scaled, const int64_t* partial_index,
                             int64_t* token_ids, float* log_probs) {
    const int row = blockIdx.x, split = threadIdx.x;
    const int slot = row * num_splits + split;
    const bool present = split < num_splits;
    Partial partial{present ? partial_max[slot] : kNegativeLarge, present ? partial_sum[slot] : 0.0f,
                    present ? partial_score[slot] : -INFINITY, present ? split : num_splits};
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) partial = merge(partial, shuffle_down(partial, offset));
    if (split != 0) return;
    const int best = min(partial.index, num_splits - 1), best_slot = row * num_splits + best;
    token_ids[row] = partial_index[best_slot];
    log_probs[row] = partial_scaled[best_slot] - (partial.max + logf(partial.sum));
}

}  // namespace

std::tuple<torch::Tensor, torch::Tensor> gumbel_sample(torch::Tensor logits, torch::Tensor temperatures,
                                                       torch::Tensor thresholds, torch::Tensor keys,
                                                       int64_t num_splits) {
    TORCH_CHECK(logits.is_cuda() && logits.dim() == 2 && logits.stride(1) == 1,
                "gumbel_sample (CUDA): logits (rows, vocabulary) on the GPU, contiguous along the vocabulary");
    TORCH_CHECK(logits.scalar_type() == torch::kBFloat16 || logits.scalar_type() == torch::kFloat32,
                "gumbel_sample (CUDA): bf16 or float32 logits");
    const int64_t rows = logits.size(0), vocab_size = logits.size(1);
    TORCH_CHECK(vocab_size % kChunk == 0 && logits.stride(0) % kChunk == 0 &&
                    reinterpret_cast<uintptr_t>(logits.data_ptr()) % 16 == 0,
                std::string("gumbel_sample (CUDA): a vocabulary and row stride that are multiples of 8 and 16-byte "
                            "aligned rows, got vocabulary ") + std::to_string(vocab_size));
    TORCH_CHECK(num_splits >= 1 && num_splits <= 32, "gumbel_sample (CUDA): 1 to 32 vocabulary splits");
    for (const torch::Tensor* vector : {&temperatures, &thresholds})
        TORCH_CHECK(vector->is_cuda() && vector->scalar_type() == torch::kFloat32 && vector->dim() == 1 &&
                        vector->size(0) == rows && vector->stride(0) == 1,
                    "gumbel_sample (CUDA): temperatures and thresholds contiguous float32 (rows,)");
    TORCH_CHECK(keys.is_cuda() && keys.scalar_type() == torch::kInt64 && keys.dim() == 1 && keys.size(0) == rows &&
                    keys.stride(0) == 1,
                "gumbel_sample (CUDA): keys contiguous int64 (rows,)");
    const auto floats = logits.options().dtype(torch::kFloat32);
    torch::Tensor partials = torch::empty({4, rows, num_splits}, floats);
    torch::Tensor partial_index = torch::empty({rows, num_splits}, logits.options().dtype(torch::kInt64));
    torch::Tensor token_ids = torch::empty({rows}, logits.options().dtype(torch::kInt64));
    torch::Tensor log_probs = torch::empty({rows}, floats);
    if (rows == 0) return {token_ids, log_probs};
    const int chunks = static_cast<int>(vocab_size / kChunk);
    const int split_chunks = static_cast<int>((chunks + num_splits - 1) / num_splits);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    float* partial = partials.data_ptr<float>();
    const int64_t stride = partials.stride(0);
    const dim3 grid(static_cast<unsigned>(num_splits), static_cast<unsigned>(rows));
    if (logits.scalar_type() == torch::kBFloat16)
        race_splits<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(
            reinterpret_cast<const __nv_bfloat16*>(logits.data_ptr()), logits.stride(0), static_cast<int>(vocab_size),
            split_chunks, temperatures.data_ptr<float>(), thresholds.data_ptr<float>(), keys.data_ptr<int64_t>(),
            partial, partial + stride, partial + 2 * stride, partial + 3 * stride, partial_index.data_ptr<int64_t>());
    else
        race_splits<float><<<grid, kThreads, 0, stream>>>(
            logits.data_ptr<float>(), logits.stride(0), static_cast<int>(vocab_size), split_chunks,
            temperatures.data_ptr<float>(), thresholds.data_ptr<float>(), keys.data_ptr<int64_t>(), partial,
            partial + stride, partial + 2 * stride, partial + 3 * stride, partial_index.data_ptr<int64_t>());
    merge_splits<<<static_cast<unsigned>(rows), 32, 0, stream>>>(
        static_cast<int>(num_splits), partial, partial + stride, partial + 2 * stride, partial + 3 * stride,
        partial_index.data_ptr<int64_t>(), token_ids.data_ptr<int64_t>(), log_probs.data_ptr<float>());
    const cudaError_t status = cudaGetLastError();
    TORCH_CHECK(status == cudaSuccess, std::string("gumbel_sample (CUDA): launch failed: ") + cudaGetErrorString(status));
    return {token_ids, log_probs};
}
