// What the standalone CUDA harnesses under benchmarks/csrc share: a checked CUDA call, and the median time of
// launches replayed from one CUDA graph (launches of a step run from graphs in the engine, so each harness
// times them that way).

#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK_CUDA(call)                                                                                   \
    do {                                                                                                   \
        const cudaError_t status_ = (call);                                                                \
        if (status_ != cudaSuccess) {                                                                      \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(status_)); \
            std::exit(1);                                                                                  \
        }                                                                                                  \
    } while (0)

// Median milliseconds of `replays` replays of one graph holding what `enqueue(stream)` launches, after 3 untimed
// replays. `enqueue` runs once more before the capture, as a warm-up (kernel attributes are set outside it).
template <typename Enqueue>
double graph_median_ms(Enqueue enqueue, int replays) {
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    enqueue(stream);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    enqueue(stream);
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 3; ++i) CHECK_CUDA(cudaGraphLaunch(exec, stream));
    cudaEvent_t start, stop;
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));
    std::vector<float> samples;
    for (int r = 0; r < replays; ++r) {
        CHECK_CUDA(cudaEventRecord(start, stream));
        CHECK_CUDA(cudaGraphLaunch(exec, stream));
        CHECK_CUDA(cudaEventRecord(stop, stream));
        CHECK_CUDA(cudaEventSynchronize(stop));
        float milliseconds = 0.0f;
        CHECK_CUDA(cudaEventElapsedTime(&milliseconds, start, stop));
        samples.push_back(milliseconds);
    }
    std::sort(samples.begin(), samples.end());
    CHECK_CUDA(cudaEventDestroy(start));
    CHECK_CUDA(cudaEventDestroy(stop));
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));
    CHECK_CUDA(cudaStreamDestroy(stream));
    return samples[samples.size() / 2];
}
