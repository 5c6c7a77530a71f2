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
    return 0;
}
