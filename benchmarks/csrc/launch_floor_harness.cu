// What a kernel boundary costs inside a CUDA graph on this GPU: the floor under each of a decode step's ~220
// launches (docs/benchmarks.md, fourteenth round: a step is 1.44 ms of fixed cost, ~50 us per layer of nine
// kernels, against 0.21 ms for its weights).
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -o .devbuild/launch_floor \
//        benchmarks/csrc/launch_floor_harness.cu
//   .devbuild/launch_floor
//
// Chains of 240 launches (24 layers x 10) replayed from one graph, median us per launch, for kernels that do
// nothing, and for kernels whose every CTA reads one value the previous launch wrote and writes one (a real
// dependency), at 1, 132 and 528 CTAs of 128 threads. Each chain also runs as programmatic dependent launches
// (the next kernel may start as the previous one's CTAs exit and waits in `griddepcontrol.wait`), and with an
// early `griddepcontrol.launch_dependents` (the next kernel may start at once and waits for this one's end).
//
// Then the alternative a persistent kernel per layer would use instead of boundaries: one launch of 132 or 264
// CTAs (one or two per SM, all resident) running 240 phases. Between phases every CTA either waits for all
// CTAs to finish the previous phase (a grid barrier: one counter per phase, incremented by each CTA's thread 0
// and spun on until it reaches the grid size) or only for one other CTA (a flag per CTA and phase: the cost
// of a point-to-point dependency, as a tile waiting on the tiles it reads). Each phase reads a value another
// CTA wrote in the previous phase and writes one, so the ordering is real.

#include <cuda_runtime.h>

#include <cstdio>

#include "harness_timing.cuh"

namespace {

constexpr int kLaunches = 240;
constexpr int kThreads = 128;

enum class Mode { kPlain, kProgrammatic, kEarlyTrigger };

__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

template <bool kTouch, bool kEarlyTrigger>
__global__ void __launch_bounds__(kThreads) step(const float* previous, float* next) {
    if (kEarlyTrigger) allow_next_grid();
    wait_for_previous_grid();
    if (kTouch && threadIdx.x == 0) next[blockIdx.x] = previous[blockIdx.x] + 1.0f;
}

template <bool kTouch>
cudaError_t launch(Mode mode, int blocks, const float* previous, float* next, cudaStream_t stream) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(blocks);
    config.blockDim = dim3(kThreads);
    config.stream = stream;
    cudaLaunchAttribute programmatic = {};
    programmatic.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    programmatic.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &programmatic;
    config.numAttrs = mode == Mode::kPlain ? 0 : 1;
    if (mode == Mode::kEarlyTrigger) return cudaLaunchKernelEx(&config, step<kTouch, true>, previous, next);
    return cudaLaunchKernelEx(&config, step<kTouch, false>, previous, next);
}

// Phase p of CTA b: read what CTA b + 1 wrote in phase p - 1, write its own value plus one; then signal and wait.
// `counters` (kLaunches of them, zero at launch) count CTAs done with each phase; `flags` (kLaunches x grid)
// mark one CTA's phase done. Loads and stores of the signals go through the L2 (volatile, fenced).
template <bool kBarrier>
__global__ void __launch_bounds__(kThreads) phases(float* values, unsigned* counters, unsigned* flags) {
    const unsigned grid = gridDim.x;
    for (int phase = 0; phase < kLaunches; ++phase) {
        if (threadIdx.x == 0) {
            // A slot per phase, so that a CTA running ahead never overwrites what a slower one has yet to read.
            float before = 0.0f;
            if (phase > 0) {
                const volatile float* previous = values + (phase - 1) * grid;
                before = previous[(blockIdx.x + 1) % grid];
            }
            values[phase * grid + blockIdx.x] = before + 1.0f;
            __threadfence();
            // Spins give up after ~1 s, so a grid that could not all be resident ends with a wrong value, not a hang.
            const long long deadline = clock64() + 2000000000LL;
            if (kBarrier) {
                atomicAdd(counters + phase, 1u);
                while (*reinterpret_cast<volatile unsigned*>(counters + phase) < grid && clock64() < deadline) {
                }
            } else {
                *reinterpret_cast<volatile unsigned*>(flags + phase * grid + blockIdx.x) = 1u;
                // The CTA whose value this one reads next phase.
                const volatile unsigned* awaited = flags + phase * grid + (blockIdx.x + 1) % grid;
                while (*awaited == 0u && clock64() < deadline) {
                }
            }
            __threadfence();
        }
        __syncthreads();
    }
}

void time_phases(int blocks) {
    float* values = nullptr;
    unsigned *counters = nullptr, *flags = nullptr;
    CHECK_CUDA(cudaMalloc(&values, static_cast<size_t>(kLaunches) * blocks * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&counters, kLaunches * sizeof(unsigned)));
    CHECK_CUDA(cudaMalloc(&flags, static_cast<size_t>(kLaunches) * blocks * sizeof(unsigned)));
    for (const bool barrier : {true, false}) {
        const double milliseconds = graph_median_ms(
            [&](cudaStream_t stream) {
                CHECK_CUDA(cudaMemsetAsync(counters, 0, kLaunches * sizeof(unsigned), stream));
                const size_t flag_bytes = static_cast<size_t>(kLaunches) * blocks * sizeof(unsigned);
                CHECK_CUDA(cudaMemsetAsync(flags, 0, flag_bytes, stream));
                if (barrier)
                    phases<true><<<blocks, kThreads, 0, stream>>>(values, counters, flags);
                else
                    phases<false><<<blocks, kThreads, 0, stream>>>(values, counters, flags);
                CHECK_CUDA(cudaGetLastError());
            },
            50);
        std::printf("phases %4d CTAs  %-28s %6.3f us per phase (one launch and two memsets per %d phases)\n",
                    blocks, barrier ? "grid barrier" : "one flag per CTA", milliseconds * 1e3 / kLaunches,
                    kLaunches);
        // Every phase adds one along a ring of CTAs, so the last phase's values count the phases.
        float value = 0.0f;
        CHECK_CUDA(cudaMemcpy(&value, values + static_cast<size_t>(kLaunches - 1) * blocks, sizeof(float),
                              cudaMemcpyDeviceToHost));
        std::printf("phases %4d CTAs  %-28s last value %.0f (%d: every phase saw the one before)\n", blocks,
                    barrier ? "grid barrier" : "one flag per CTA", value, kLaunches);
    }
    CHECK_CUDA(cudaFree(values));
    CHECK_CUDA(cudaFree(counters));
    CHECK_CUDA(cudaFree(flags));
}

}  // namespace

int main() {
    float* buffers[2];
    for (float*& buffer : buffers) {
        CHECK_CUDA(cudaMalloc(&buffer, 4096 * sizeof(float)));
        CHECK_CUDA(cudaMemset(buffer, 0, 4096 * sizeof(float)));
    }
    const char* mode_names[] = {"plain", "programmatic", "programmatic, early trigger"};
    std::printf("us per launch, %d launches per graph (median of 50 replays)\n", kLaunches);
    for (const bool touch : {false, true})
        for (const int blocks : {1, 132, 528})
            for (const Mode mode : {Mode::kPlain, Mode::kProgrammatic, Mode::kEarlyTrigger}) {
                const double milliseconds = graph_median_ms(
                    [&](cudaStream_t stream) {
                        for (int i = 0; i < kLaunches; ++i) {
                            const float* previous = buffers[i % 2];
                            float* next = buffers[(i + 1) % 2];
                            CHECK_CUDA(touch ? launch<true>(mode, blocks, previous, next, stream)
                                             : launch<false>(mode, blocks, previous, next, stream));
                        }
                    },
                    50);
                std::printf("%-6s %4d CTAs  %-28s %6.3f us\n", touch ? "touch" : "empty", blocks,
                            mode_names[static_cast<int>(mode)], milliseconds * 1e3 / kLaunches);
            }
    // Every touching launch adds one to what the previous one wrote, so the chain's value counts them.
    float value = 0.0f;
    CHECK_CUDA(cudaMemcpy(&value, buffers[0], sizeof(float), cudaMemcpyDeviceToHost));
    std::printf("chain value %.0f (nonzero: the dependent chains ran)\n", value);
    int sm_count = 0;
    CHECK_CUDA(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
    for (const int blocks : {sm_count, 2 * sm_count}) time_phases(blocks);
    return 0;
}
