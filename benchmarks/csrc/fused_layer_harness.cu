// A decode layer's four products with the norms, the bias, SiLU x up and the residual adds fused into them
// (asyncrl/engine/csrc/fused_product_kernel.cuh), checked and timed without torch. The question: how much of a layer's fixed cost do
// the fusions take away? The engine's layer, without attention, is 9 kernels (add + norm, q/k/v, o, add + norm,
// gate/up, SiLU x up, down and cuBLAS's split-K reduction); fused, it is 4:
//   q/k/v   = r1 * (x (W_qkv * g1)^T) + b                  (the norm in the prologue, the bias in the epilogue)
//   x_mid   = x + attended W_o^T                            (the residual in the epilogue)
//   h       = SiLU(r2 * gate) * (r2 * up), gate/up of x_mid (the norm in the prologue, SwiGLU in the epilogue)
//   x_next  = x_mid + h W_down^T                            (K split over a cluster, reduced in it, the residual)
// `benchmarks/decode_norm_fold.py` times the engine's own layers in the same setup (24 layers, attention replaced
// by a stand-in, one CUDA graph, 256 rows).
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I benchmarks/csrc -I asyncrl/engine/csrc \
//        -o .devbuild/fused_layer_harness benchmarks/csrc/fused_layer_harness.cu
//   .devbuild/fused_layer_harness check   # every configuration against an fp32 reference, at 256 and 100 rows
//   .devbuild/fused_layer_harness time    # us per product over 24 distinct weights, then the 24-layer chain
//   .devbuild/fused_layer_harness layer   # the chain with the engine's attention kernel (contexts 640-1,536)
//   .devbuild/fused_layer_harness halves  # the batch as two chains of 128 rows, one after the other or at once
//
// Answer (one H200, 2026-12-04, docs/benchmarks.md seventeenth round): all correct. The four fused products chained
// take 39.2 us per layer with plain launches and 32.8 us as programmatic dependent launches, against 40.2 us for the
// engine's nine kernels. The norm summed from the A tiles costs ~4 us (these products are bound by shared-memory
// traffic); its statistics from the product before cost ~0.5 us. The engine runs this chain (fused_decode.py).
// Round 19: attention as a programmatic launch too takes the chain with attention from 72.5 to 71.1-71.4 us per
// layer (the engine runs it so); the halves on two streams measured 68.8-75.9 us against 73.1 for the one chain.

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "decode_attention_case.cuh"
#include "fused_product_kernel.cuh"
#include "gemm_check.cuh"
#include "harness_timing.cuh"

using Launch = void (*)(const __nv_bfloat16*, const __nv_bfloat16*, const fused::Arguments&, cudaStream_t, bool);

struct Product {
    const char* shape;  // q/k/v, o, gate/up, down
    const char* name;
    int n, k;  // output columns (gate/up: the intermediate size; its weight has 2 n rows), reduction depth
    int epilogue;
    int norm;  // fused::kNoNorm, kNormInKernel or kNormFromStats
    bool bias;
    Launch launch;
};

using fused::kNoNorm;
using fused::kNormFromStats;
using fused::kNormInKernel;
using fused::kPlain;
using fused::kResidual;
using fused::kSwiglu;

constexpr int kHidden = 896, kQkv = 1152, kInter = 4864;  // Qwen2.5-0.5B
constexpr float kEps = 1e-6f;

// A table entry: the epilogue and norm are the launch's own template arguments.
template <int BN, int BM, int STAGES, int EPILOGUE, int NORM, int SPLITS>
Product product(const char* shape, const char* name, int n, int k, bool bias) {
    return {shape, name, n, k, EPILOGUE, NORM, bias, fused::launch<BN, BM, STAGES, EPILOGUE, NORM, SPLITS>};
}

const Product kProducts[] = {
    product<32, 128, 8, kPlain, kNoNorm, 1>("q/k/v", "plain BN 32, BM 128, 8 st", kQkv, kHidden, false),
    product<32, 128, 8, kPlain, kNormInKernel, 1>("q/k/v", "norm + bias BN 32, BM 128, 8 st", kQkv, kHidden, true),
    product<32, 128, 8, kPlain, kNormFromStats, 1>("q/k/v", "stats + bias BN 32, BM 128, 8 st", kQkv, kHidden, true),
    product<32, 128, 8, kPlain, kNoNorm, 1>("o", "plain BN 32, BM 128, 8 st", kHidden, kHidden, false),
    product<32, 128, 8, kResidual, kNoNorm, 1>("o", "residual BN 32, BM 128, 8 st", kHidden, kHidden, false),
    product<32, 256, 5, kResidual, kNoNorm, 2>("o", "residual BN 32, BM 256, 5 st, split 2", kHidden, kHidden, false),
    product<80, 256, 5, kPlain, kNoNorm, 1>("gate/up", "plain BN 80, BM 256, 5 st", 2 * kInter, kHidden, false),
    product<80, 256, 5, kSwiglu, kNoNorm, 1>("gate/up", "SwiGLU BN 80, BM 256, 5 st", kInter, kHidden, false),
    product<80, 256, 5, kSwiglu, kNormInKernel, 1>("gate/up", "norm + SwiGLU BN 80, BM 256, 5 st", kInter, kHidden, false),
    product<80, 256, 5, kSwiglu, kNormFromStats, 1>("gate/up", "stats + SwiGLU BN 80, BM 256, 5 st", kInter, kHidden, false),
    product<32, 256, 5, kResidual, kNoNorm, 4>("down", "residual BN 32, BM 256, 5 st, split 4", kHidden, kInter, false),
    product<64, 256, 5, kResidual, kNoNorm, 8>("down", "residual BN 64, BM 256, 5 st, split 8", kHidden, kInter, false),
    product<64, 128, 8, kResidual, kNoNorm, 4>("down", "residual BN 64, BM 128, 8 st, split 4", kHidden, kInter, false),
    // Fewer stages, so that a CTA of the next product fits in shared memory beside one of these: down (96 KB, ~25k
    // registers) beside q/k/v (80 KB, ~16k). o (80 KB) beside gate/up (126 KB) fits in shared memory, but not in
    // registers as compiled (~25k + ~49k of 64k), nor does gate/up beside down. Not yet measured.
    product<32, 128, 4, kPlain, kNormFromStats, 1>("q/k/v", "stats + bias BN 32, BM 128, 4 st", kQkv, kHidden, true),
    product<32, 128, 4, kResidual, kNoNorm, 1>("o", "residual BN 32, BM 128, 4 st", kHidden, kHidden, false),
    product<80, 256, 3, kSwiglu, kNormFromStats, 1>("gate/up", "stats + SwiGLU BN 80, BM 256, 3 st", kInter, kHidden, false),
    product<64, 128, 4, kResidual, kNoNorm, 4>("down", "residual BN 64, BM 128, 4 st, split 4", kHidden, kInter, false),
    // gate/up for a half batch of 128 rows (`halves` mode): BM 256 would compute 128 rows of padding.
    product<80, 128, 6, kSwiglu, kNormFromStats, 1>("gate/up", "stats + SwiGLU BN 80, BM 128, 6 st", kInter, kHidden, false),
};

const Product& find_product(const std::string& shape, const std::string& name) {
    for (const Product& p : kProducts)
        if (shape == p.shape && name == p.name) return p;
    std::fprintf(stderr, "no product %s / %s\n", shape.c_str(), name.c_str());
    std::exit(2);
}

int weight_rows(const Product& p) { return p.epilogue == kSwiglu ? 2 * p.n : p.n; }

template <typename T>
std::vector<T> to_host(const T* device, size_t count) {
    std::vector<T> host(count);
    CHECK_CUDA(cudaMemcpy(host.data(), device, sizeof(T) * count, cudaMemcpyDeviceToHost));
    return host;
}

// What the product should write, from the fp32 reference product: r, the bias, SwiGLU and the residual as the
// kernel's doc says, with the roundings of the composition it replaces.
std::vector<float> expected_output(const Product& p, int m, const std::vector<float>& products,
                                   const std::vector<__nv_bfloat16>& a, const std::vector<__nv_bfloat16>& bias,
                                   const std::vector<__nv_bfloat16>& residual) {
    const int rows = weight_rows(p);
    std::vector<float> expected(static_cast<size_t>(m) * p.n);
    for (int row = 0; row < m; ++row) {
        float scale = 1.0f;
        if (p.norm) {
            double sum = 0.0;
            for (int i = 0; i < p.k; ++i) sum += std::pow(__bfloat162float(a[static_cast<size_t>(row) * p.k + i]), 2);
            scale = static_cast<float>(1.0 / std::sqrt(sum / p.k + kEps));
        }
        for (int column = 0; column < p.n; ++column) {
            const float product = products[static_cast<size_t>(row) * rows + column] * scale;
            float value = product;
            if (p.epilogue == kSwiglu) {
                const float gate = fused::bf16_round(product);
                const float up = fused::bf16_round(products[static_cast<size_t>(row) * rows + p.n + column] * scale);
                value = gate / (1.0f + std::exp(-gate)) * up;
            }
            if (p.bias) value += __bfloat162float(bias[column]);
            if (p.epilogue == kResidual)
                value = fused::bf16_round(value) + __bfloat162float(residual[static_cast<size_t>(row) * p.n + column]);
            expected[static_cast<size_t>(row) * p.n + column] = value;
        }
    }
    return expected;
}

bool check_product(const Product& p, int m) {
    const int rows = weight_rows(p);
    __nv_bfloat16 *a, *w, *bias, *residual, *out;
    float *reference, *squares_in, *squares_out;
    CHECK_CUDA(cudaMalloc(&squares_in, sizeof(float) * m));
    CHECK_CUDA(cudaMalloc(&squares_out, sizeof(float) * m));
    CHECK_CUDA(cudaMalloc(&a, sizeof(__nv_bfloat16) * m * p.k));
    CHECK_CUDA(cudaMalloc(&w, sizeof(__nv_bfloat16) * rows * p.k));
    CHECK_CUDA(cudaMalloc(&bias, sizeof(__nv_bfloat16) * p.n));
    CHECK_CUDA(cudaMalloc(&residual, sizeof(__nv_bfloat16) * m * p.n));
    CHECK_CUDA(cudaMalloc(&out, sizeof(__nv_bfloat16) * m * p.n));
    CHECK_CUDA(cudaMalloc(&reference, sizeof(float) * m * rows));
    fill_random<<<512, 256>>>(a, static_cast<size_t>(m) * p.k, 1, 2.0f);
    fill_random<<<512, 256>>>(w, static_cast<size_t>(rows) * p.k, 2, 0.1f);
    fill_random<<<512, 256>>>(bias, p.n, 3, 1.0f);
    fill_random<<<512, 256>>>(residual, static_cast<size_t>(m) * p.n, 4, 4.0f);
    reference_gemm<<<dim3((rows + 127) / 128, m), 128>>>(a, w, reference, m, rows, p.k);
    CHECK_CUDA(cudaMemset(out, 0xFF, sizeof(__nv_bfloat16) * m * p.n));  // NaN: an unwritten output shows
    const std::vector<__nv_bfloat16> a_host = to_host(a, static_cast<size_t>(m) * p.k);
    std::vector<float> squares(m, 0.0f);  // the stats a product before would have added up
    for (int row = 0; row < m; ++row)
        for (int i = 0; i < p.k; ++i) squares[row] += std::pow(__bfloat162float(a_host[static_cast<size_t>(row) * p.k + i]), 2);
    CHECK_CUDA(cudaMemcpy(squares_in, squares.data(), sizeof(float) * m, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(squares_out, 0, sizeof(float) * m));
    const fused::Arguments args{out, p.bias ? bias : nullptr, residual, m, p.n, p.k, kEps, squares_in, squares_out,
                                nullptr};
    p.launch(a, w, args, 0, false);
    CHECK_CUDA(cudaDeviceSynchronize());
    const std::vector<float> expected = expected_output(p, m, to_host(reference, static_cast<size_t>(m) * rows), a_host,
                                                        to_host(bias, p.n), to_host(residual, static_cast<size_t>(m) * p.n));
    float largest = 0.0f;
    for (float value : expected) largest = std::fmax(largest, std::fabs(value));
    const std::vector<__nv_bfloat16> result = to_host(out, static_cast<size_t>(m) * p.n);
    const double worst = largest_error(result, expected, largest);
    bool ok = worst < 1e-2;
    std::printf("check %-8s %-42s m %3d: largest error %.2e of the largest output: %s\n", p.shape, p.name, m, worst,
                ok ? "ok" : "WRONG");
    if (p.epilogue == kResidual) {  // the stats it adds up for the next norm: the squares of what it stored
        const std::vector<float> added = to_host(squares_out, m);
        double worst_stats = 0.0;
        for (int row = 0; row < m; ++row) {
            double sum = 0.0;
            for (int column = 0; column < p.n; ++column)
                sum += std::pow(__bfloat162float(result[static_cast<size_t>(row) * p.n + column]), 2);
            worst_stats = std::fmax(worst_stats, std::fabs(added[row] - sum) / sum);
        }
        const bool stats_ok = worst_stats < 1e-4;
        ok = ok && stats_ok;
        std::printf("check %-8s %-42s m %3d: its rows' sums of squares within %.2e: %s\n", p.shape, p.name, m,
                    worst_stats, stats_ok ? "ok" : "WRONG");
    }
    for (void* pointer : {static_cast<void*>(a), static_cast<void*>(w), static_cast<void*>(bias),
                          static_cast<void*>(residual), static_cast<void*>(out), static_cast<void*>(reference),
                          static_cast<void*>(squares_in), static_cast<void*>(squares_out)})
        CHECK_CUDA(cudaFree(pointer));
    return ok;
}

void time_all() {
    const int m = 256, layers = 24;
    float* squares;
    CHECK_CUDA(cudaMalloc(&squares, sizeof(float) * m));
    CHECK_CUDA(cudaMemset(squares, 0, sizeof(float) * m));
    std::vector<Product> products(std::begin(kProducts), std::end(kProducts));
    for (const Product& p : kProducts)  // down's fixed cost: a block or two of K per split, the launch and the reduction
        if (std::string(p.shape) == "down") products.push_back({"down K512", p.name, p.n, 512, p.epilogue, p.norm, p.bias, p.launch});
    for (const Product& p : products) {
        const int rows = weight_rows(p);
        __nv_bfloat16 *a, *w, *bias, *residual, *out;
        CHECK_CUDA(cudaMalloc(&a, sizeof(__nv_bfloat16) * m * p.k));
        CHECK_CUDA(cudaMalloc(&w, sizeof(__nv_bfloat16) * layers * rows * p.k));
        CHECK_CUDA(cudaMalloc(&bias, sizeof(__nv_bfloat16) * p.n));
        CHECK_CUDA(cudaMalloc(&residual, sizeof(__nv_bfloat16) * m * p.n));
        CHECK_CUDA(cudaMalloc(&out, sizeof(__nv_bfloat16) * layers * m * p.n));
        fill_random<<<512, 256>>>(a, static_cast<size_t>(m) * p.k, 1, 2.0f);
        fill_random<<<512, 256>>>(w, static_cast<size_t>(layers) * rows * p.k, 2, 0.1f);
        fill_random<<<512, 256>>>(bias, p.n, 3, 1.0f);
        fill_random<<<512, 256>>>(residual, static_cast<size_t>(m) * p.n, 4, 4.0f);
        CHECK_CUDA(cudaDeviceSynchronize());
        const double milliseconds = graph_median_ms(
            [&](cudaStream_t stream) {
                for (int layer = 0; layer < layers; ++layer) {
                    const fused::Arguments args{out + static_cast<size_t>(layer) * m * p.n, p.bias ? bias : nullptr,
                                                residual, m, p.n, p.k, kEps, squares, squares, nullptr};
                    p.launch(a, w + static_cast<size_t>(layer) * rows * p.k, args, stream, false);
                }
            },
            20);
        std::printf("time %-9s %-42s %6.2f us per product\n", p.shape, p.name, milliseconds * 1e3 / layers);
        for (void* pointer : {static_cast<void*>(a), static_cast<void*>(w), static_cast<void*>(bias),
                              static_cast<void*>(residual), static_cast<void*>(out)})
            CHECK_CUDA(cudaFree(pointer));
    }
    CHECK_CUDA(cudaFree(squares));
}

constexpr int kLayers = 24;

// The 24 layers' weights, shared by every chain that runs them.
struct Weights {
    static constexpr size_t kQkv = static_cast<size_t>(::kQkv) * kHidden, kO = static_cast<size_t>(kHidden) * kHidden,
                            kGateUp = static_cast<size_t>(2) * kInter * kHidden,
                            kDown = static_cast<size_t>(kHidden) * kInter;
    __nv_bfloat16 *qkv, *qkv_bias, *o, *gate_up, *down;

    Weights() {
        CHECK_CUDA(cudaMalloc(&qkv, sizeof(__nv_bfloat16) * kLayers * kQkv));
        CHECK_CUDA(cudaMalloc(&qkv_bias, sizeof(__nv_bfloat16) * kLayers * ::kQkv));
        CHECK_CUDA(cudaMalloc(&o, sizeof(__nv_bfloat16) * kLayers * kO));
        CHECK_CUDA(cudaMalloc(&gate_up, sizeof(__nv_bfloat16) * kLayers * kGateUp));
        CHECK_CUDA(cudaMalloc(&down, sizeof(__nv_bfloat16) * kLayers * kDown));
        fill_random<<<512, 256>>>(qkv, kLayers * kQkv, 2, 0.05f);
        fill_random<<<512, 256>>>(qkv_bias, static_cast<size_t>(kLayers) * ::kQkv, 3, 0.1f);
        fill_random<<<512, 256>>>(o, kLayers * kO, 6, 0.05f);
        fill_random<<<512, 256>>>(gate_up, kLayers * kGateUp, 7, 0.05f);
        fill_random<<<512, 256>>>(down, kLayers * kDown, 8, 0.02f);
    }
    ~Weights() {
        for (void* pointer : {static_cast<void*>(qkv), static_cast<void*>(qkv_bias), static_cast<void*>(o),
                              static_cast<void*>(gate_up), static_cast<void*>(down)})
            CHECK_CUDA(cudaFree(pointer));
    }
};

// One chain's activations over m rows: the stream x and x_mid alternate as the residual; the norms' statistics of x
// (down adds them up) and of x_mid (o does). With an attention case, q/k/v writes the case's q/k/v buffer and o
// reads its output (its views); without, o reads a fixed stand-in for attention's output.
struct Activations {
    int m;
    const attention_case::Case* attention;
    __nv_bfloat16 *x, *qkv, *attended, *x_mid, *h;
    float *squares_x, *squares_mid;

    Activations(int rows, const attention_case::Case* case_or_null) : m(rows), attention(case_or_null) {
        CHECK_CUDA(cudaMalloc(&squares_x, sizeof(float) * m));
        CHECK_CUDA(cudaMalloc(&squares_mid, sizeof(float) * m));
        CHECK_CUDA(cudaMemset(squares_x, 0, sizeof(float) * m));
        CHECK_CUDA(cudaMemset(squares_mid, 0, sizeof(float) * m));
        CHECK_CUDA(cudaMalloc(&x, sizeof(__nv_bfloat16) * m * kHidden));
        CHECK_CUDA(cudaMalloc(&qkv, sizeof(__nv_bfloat16) * m * ::kQkv));
        CHECK_CUDA(cudaMalloc(&attended, sizeof(__nv_bfloat16) * m * kHidden));
        CHECK_CUDA(cudaMalloc(&x_mid, sizeof(__nv_bfloat16) * m * kHidden));
        CHECK_CUDA(cudaMalloc(&h, sizeof(__nv_bfloat16) * m * kInter));
        fill_random<<<512, 256>>>(x, static_cast<size_t>(m) * kHidden, 1, 2.0f);
        fill_random<<<512, 256>>>(attended, static_cast<size_t>(m) * kHidden, 5, 2.0f);
    }
    ~Activations() {
        for (void* pointer : {static_cast<void*>(x), static_cast<void*>(qkv), static_cast<void*>(attended),
                              static_cast<void*>(x_mid), static_cast<void*>(h), static_cast<void*>(squares_x),
                              static_cast<void*>(squares_mid)})
            CHECK_CUDA(cudaFree(pointer));
    }
    __nv_bfloat16* qkv_target() const { return attention != nullptr ? attention->query : qkv; }
    __nv_bfloat16* attended_source() const { return attention != nullptr ? attention->output : attended; }
};

struct Chain {
    const Product &qkv, &o, &gate_up, &down;
};

Chain find_chain(const char* qkv, const char* o, const char* gate_up, const char* down) {
    return {find_product("q/k/v", qkv), find_product("o", o), find_product("gate/up", gate_up),
            find_product("down", down)};
}

// One layer of a chain on `stream`; which: -1 the layer, else only that part (0-3 the products, 4 attention).
// `programmatic_attention`: attention too as a programmatic dependent launch (it fetches its first tiles of the
// cache while q/k/v finishes, and lets o launch as its CTAs leave).
void enqueue_layer(const Chain& chain, const Activations& a, const Weights& w, int layer, cudaStream_t stream,
                   bool programmatic, int which, bool programmatic_attention = false) {
    const int m = a.m;
    if (which < 0 || which == 0)
        chain.qkv.launch(a.x, w.qkv + layer * Weights::kQkv,
                         {a.qkv_target(), w.qkv_bias + static_cast<size_t>(layer) * ::kQkv, nullptr, m, ::kQkv, kHidden,
                          kEps, a.squares_x, nullptr, a.squares_mid},
                         stream, programmatic);
    if (a.attention != nullptr && (which < 0 || which == 4))
        CHECK_CUDA(asyncrl_decode::launch_paged_decode(a.attention->params(layer), 64, 4, 3, programmatic_attention,
                                                       stream));
    if (which < 0 || which == 1)
        chain.o.launch(a.attended_source(), w.o + layer * Weights::kO,
                       {a.x_mid, nullptr, a.x, m, kHidden, kHidden, kEps, nullptr, a.squares_mid, nullptr}, stream,
                       programmatic);
    if (which < 0 || which == 2)
        chain.gate_up.launch(a.x_mid, w.gate_up + layer * Weights::kGateUp,
                             {a.h, nullptr, nullptr, m, kInter, kHidden, kEps, a.squares_mid, nullptr, a.squares_x},
                             stream, programmatic);
    if (which < 0 || which == 3)
        chain.down.launch(a.h, w.down + layer * Weights::kDown,
                          {a.x, nullptr, a.x_mid, m, kHidden, kInter, kEps, nullptr, a.squares_x, nullptr}, stream,
                          programmatic);
}

// The 24 layers' four fused products in one graph, each layer reading what the one before wrote. Without an
// attention case o reads a fixed stand-in for attention's output; with one, the engine's attention kernel runs
// between q/k/v and o (a plain launch, as in the engine) on that case's caches, reading q/k/v's output.
void time_chain(const char* qkv_name, const char* o_name, const char* gate_up_name, const char* down_name,
                bool programmatic, const attention_case::Case* attention = nullptr,
                bool programmatic_attention = false) {
    const Chain chain = find_chain(qkv_name, o_name, gate_up_name, down_name);
    const Weights weights;
    const Activations activations(256, attention);
    CHECK_CUDA(cudaDeviceSynchronize());
    auto enqueue = [&](cudaStream_t stream, int which) {
        for (int layer = 0; layer < kLayers; ++layer)
            enqueue_layer(chain, activations, weights, layer, stream, programmatic, which, programmatic_attention);
    };
    const char* parts[] = {"q/k/v", "o", "gate/up", "down", "attention"};
    double sum = 0.0;
    for (int which = 0; which < (attention != nullptr ? 5 : 4); ++which) {
        const double us = graph_median_ms([&](cudaStream_t stream) { enqueue(stream, which); }, 20) * 1e3 / kLayers;
        sum += us;
        std::printf("chain %-8s alone %6.2f us per layer\n", parts[which], us);
    }
    const double us = graph_median_ms([&](cudaStream_t stream) { enqueue(stream, -1); }, 20) * 1e3 / kLayers;
    std::printf("chain layer%s%s%s (%s | %s | %s | %s): %6.2f us per layer (the parts alone sum to %.2f)\n",
                attention != nullptr ? " with attention" : "", programmatic ? ", programmatic" : "",
                programmatic_attention ? " (attention too)" : "", qkv_name, o_name, gate_up_name, down_name, us, sum);
}

// The batch as two halves of 128 rows, each its own chain of programmatic launches over the shared weights. The
// question: a product's fixed cost (its first A round trip after the wait, its epilogue, its last wave) is ~4-5 us
// of its ~6-12; can the other half's products fill that time? Timed three ways, per layer of both halves: the
// halves one after the other on one stream (each layer of A, then of B, so B's weights come from L2), and on two
// streams that run at once. With attention cases (one per half), the attention kernel runs in each chain.
void time_halves(const char* qkv_name, const char* o_name, const char* gate_up_name, const char* down_name,
                 const attention_case::Case* attention_a = nullptr, const attention_case::Case* attention_b = nullptr,
                 bool programmatic_attention = false) {
    const Chain chain = find_chain(qkv_name, o_name, gate_up_name, down_name);
    const Weights weights;
    const Activations half_a(128, attention_a), half_b(128, attention_b);
    CHECK_CUDA(cudaDeviceSynchronize());
    cudaStream_t other;
    cudaEvent_t fork, join;
    CHECK_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    CHECK_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK_CUDA(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    const double one_half = graph_median_ms([&](cudaStream_t stream) {
        for (int layer = 0; layer < kLayers; ++layer) enqueue_layer(chain, half_a, weights, layer, stream, true, -1, programmatic_attention);
    }, 20) * 1e3 / kLayers;
    const double in_turn = graph_median_ms([&](cudaStream_t stream) {
        for (int layer = 0; layer < kLayers; ++layer) {
            enqueue_layer(chain, half_a, weights, layer, stream, true, -1, programmatic_attention);
            enqueue_layer(chain, half_b, weights, layer, stream, true, -1, programmatic_attention);
        }
    }, 20) * 1e3 / kLayers;
    const double together = graph_median_ms([&](cudaStream_t stream) {
        CHECK_CUDA(cudaEventRecord(fork, stream));
        CHECK_CUDA(cudaStreamWaitEvent(other, fork, 0));
        for (int layer = 0; layer < kLayers; ++layer) {
            enqueue_layer(chain, half_a, weights, layer, stream, true, -1, programmatic_attention);
            enqueue_layer(chain, half_b, weights, layer, other, true, -1, programmatic_attention);
        }
        CHECK_CUDA(cudaEventRecord(join, other));
        CHECK_CUDA(cudaStreamWaitEvent(stream, join, 0));
    }, 20) * 1e3 / kLayers;
    std::printf("halves%s%s (%s | %s | %s | %s): one half %6.2f us per layer; both in turn on one stream %6.2f; both "
                "at once on two streams %6.2f\n", attention_a != nullptr ? " with attention" : "",
                programmatic_attention ? " (programmatic)" : "", qkv_name, o_name,
                gate_up_name, down_name, one_half, in_turn, together);
    CHECK_CUDA(cudaStreamDestroy(other));
    CHECK_CUDA(cudaEventDestroy(fork));
    CHECK_CUDA(cudaEventDestroy(join));
}

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "check";
    if (mode == "check") {
        bool ok = true;
        for (int m : {256, 100})
            for (const Product& p : kProducts) ok = check_product(p, m) && ok;
        return ok ? 0 : 1;
    }
    if (mode == "time") {
        time_all();
        for (bool programmatic : {false, true}) {
            time_chain("stats + bias BN 32, BM 128, 8 st", "residual BN 32, BM 128, 8 st",
                       "stats + SwiGLU BN 80, BM 256, 5 st", "residual BN 64, BM 128, 8 st, split 4", programmatic);
            time_chain("stats + bias BN 32, BM 128, 8 st", "residual BN 32, BM 128, 8 st",
                       "stats + SwiGLU BN 80, BM 256, 5 st", "residual BN 32, BM 256, 5 st, split 4", programmatic);
            time_chain("stats + bias BN 32, BM 128, 4 st", "residual BN 32, BM 128, 4 st",
                       "stats + SwiGLU BN 80, BM 256, 3 st", "residual BN 64, BM 128, 4 st, split 4", programmatic);
        }
        return 0;
    }
    if (mode == "layer") {  // the chain with the engine's attention kernel between q/k/v and o
        std::vector<int> lengths(256);
        uint64_t state = 5;
        for (int& length : lengths) length = 640 + static_cast<int>(attention_case::next_random(state) % 897);
        attention_case::Case attention = attention_case::make_case(attention_case::shape_of(64), lengths, 24, 11);
        attention_case::add_rotary(attention);
        for (int variant = 0; variant < 3; ++variant)  // plain, programmatic products, attention programmatic too
            time_chain("stats + bias BN 32, BM 128, 8 st", "residual BN 32, BM 128, 8 st",
                       "stats + SwiGLU BN 80, BM 256, 5 st", "residual BN 64, BM 128, 8 st, split 4", variant > 0,
                       &attention, variant == 2);
        for (bool programmatic : {false, true}) {
            time_chain("stats + bias BN 32, BM 128, 4 st", "residual BN 32, BM 128, 4 st",
                       "stats + SwiGLU BN 80, BM 256, 3 st", "residual BN 64, BM 128, 4 st, split 4", programmatic,
                       &attention);
        }
        return 0;
    }
    if (mode == "halves") {  // the batch as two chains of 128 rows, without and with attention
        const char *qkv = "stats + bias BN 32, BM 128, 8 st", *o = "residual BN 32, BM 128, 8 st",
                   *down = "residual BN 64, BM 128, 8 st, split 4";
        time_chain(qkv, o, "stats + SwiGLU BN 80, BM 256, 5 st", down, true);
        time_halves(qkv, o, "stats + SwiGLU BN 80, BM 128, 6 st", down);
        time_halves(qkv, o, "stats + SwiGLU BN 80, BM 256, 5 st", down);
        std::vector<int> lengths(256);
        uint64_t state = 5;
        for (int& length : lengths) length = 640 + static_cast<int>(attention_case::next_random(state) % 897);
        const std::vector<int> first(lengths.begin(), lengths.begin() + 128), second(lengths.begin() + 128, lengths.end());
        attention_case::Case whole = attention_case::make_case(attention_case::shape_of(64), lengths, kLayers, 11);
        attention_case::Case half_a = attention_case::make_case(attention_case::shape_of(64), first, kLayers, 12);
        attention_case::Case half_b = attention_case::make_case(attention_case::shape_of(64), second, kLayers, 13);
        for (attention_case::Case* c : {&whole, &half_a, &half_b}) attention_case::add_rotary(*c);
        time_chain(qkv, o, "stats + SwiGLU BN 80, BM 256, 5 st", down, true, &whole);
        time_halves(qkv, o, "stats + SwiGLU BN 80, BM 128, 6 st", down, &half_a, &half_b);
        time_chain(qkv, o, "stats + SwiGLU BN 80, BM 256, 5 st", down, true, &whole, true);
        time_halves(qkv, o, "stats + SwiGLU BN 80, BM 128, 6 st", down, &half_a, &half_b, true);
        return 0;
    }
    std::fprintf(stderr, "usage: %s check | time | layer | halves\n", argv[0]);
    return 2;
}
