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
//
// Answer (one H200, 2026-12-04, docs/benchmarks.md seventeenth round): all correct. The four fused products chained
// take 39.2 us per layer with plain launches and 32.8 us as programmatic dependent launches, against 40.2 us for the
// engine's nine kernels. The norm summed from the A tiles costs ~4 us (these products are bound by shared-memory
// traffic); its statistics from the product before cost ~0.5 us. The engine runs this chain (fused_decode.py).

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

// One layer's buffers and weights for the timed chain; the stream x and x_mid alternate as the residual.
struct LayerBuffers {
    __nv_bfloat16 *x, *qkv, *attended, *x_mid, *h;
    __nv_bfloat16 *w_qkv, *b_qkv, *w_o, *w_gate_up, *w_down;  // 24 layers each, back to back
};

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

// The 24 layers' four fused products in one graph, each layer reading what the one before wrote. Without an
// attention case o reads a fixed stand-in for attention's output; with one, the engine's attention kernel runs
// between q/k/v and o (a plain launch, as in the engine) on that case's caches, reading q/k/v's output.
void time_chain(const char* qkv_name, const char* o_name, const char* gate_up_name, const char* down_name,
                bool programmatic, const attention_case::Case* attention = nullptr) {
    const Product &qkv = find_product("q/k/v", qkv_name), &o = find_product("o", o_name),
                  &gate_up = find_product("gate/up", gate_up_name), &down = find_product("down", down_name);
    const int m = 256, layers = 24;
    __nv_bfloat16 *x, *qkv_out, *attended, *x_mid, *h, *w_qkv, *b_qkv, *w_o, *w_gate_up, *w_down;
    float *squares_x, *squares_mid;  // the norms' statistics: of x (down adds them up), of x_mid (o does)
    CHECK_CUDA(cudaMalloc(&squares_x, sizeof(float) * m));
    CHECK_CUDA(cudaMalloc(&squares_mid, sizeof(float) * m));
    CHECK_CUDA(cudaMemset(squares_x, 0, sizeof(float) * m));
    CHECK_CUDA(cudaMemset(squares_mid, 0, sizeof(float) * m));
    const size_t qkv_weights = static_cast<size_t>(kQkv) * kHidden, o_weights = static_cast<size_t>(kHidden) * kHidden,
                 gate_up_weights = static_cast<size_t>(2) * kInter * kHidden,
                 down_weights = static_cast<size_t>(kHidden) * kInter;
    CHECK_CUDA(cudaMalloc(&x, sizeof(__nv_bfloat16) * m * kHidden));
    CHECK_CUDA(cudaMalloc(&qkv_out, sizeof(__nv_bfloat16) * m * kQkv));
    CHECK_CUDA(cudaMalloc(&attended, sizeof(__nv_bfloat16) * m * kHidden));
    __nv_bfloat16 *qkv_target = qkv_out, *attended_source = attended;
    if (attention != nullptr) {  // the case's q/k/v buffer (m x 1152, its views) and attention output (m x 896)
        qkv_target = attention->query;
        attended_source = attention->output;
    }
    CHECK_CUDA(cudaMalloc(&x_mid, sizeof(__nv_bfloat16) * m * kHidden));
    CHECK_CUDA(cudaMalloc(&h, sizeof(__nv_bfloat16) * m * kInter));
    CHECK_CUDA(cudaMalloc(&w_qkv, sizeof(__nv_bfloat16) * layers * qkv_weights));
    CHECK_CUDA(cudaMalloc(&b_qkv, sizeof(__nv_bfloat16) * layers * kQkv));
    CHECK_CUDA(cudaMalloc(&w_o, sizeof(__nv_bfloat16) * layers * o_weights));
    CHECK_CUDA(cudaMalloc(&w_gate_up, sizeof(__nv_bfloat16) * layers * gate_up_weights));
    CHECK_CUDA(cudaMalloc(&w_down, sizeof(__nv_bfloat16) * layers * down_weights));
    fill_random<<<512, 256>>>(x, static_cast<size_t>(m) * kHidden, 1, 2.0f);
    fill_random<<<512, 256>>>(attended, static_cast<size_t>(m) * kHidden, 5, 2.0f);
    fill_random<<<512, 256>>>(w_qkv, layers * qkv_weights, 2, 0.05f);
    fill_random<<<512, 256>>>(b_qkv, static_cast<size_t>(layers) * kQkv, 3, 0.1f);
    fill_random<<<512, 256>>>(w_o, layers * o_weights, 6, 0.05f);
    fill_random<<<512, 256>>>(w_gate_up, layers * gate_up_weights, 7, 0.05f);
    fill_random<<<512, 256>>>(w_down, layers * down_weights, 8, 0.02f);
    CHECK_CUDA(cudaDeviceSynchronize());
    auto enqueue = [&](cudaStream_t stream, int which) {  // which: -1 the layer, else only that part
        for (int layer = 0; layer < layers; ++layer) {
            if (which < 0 || which == 0)
                qkv.launch(x, w_qkv + layer * qkv_weights,
                           {qkv_target, b_qkv + static_cast<size_t>(layer) * kQkv, nullptr, m, kQkv, kHidden, kEps, squares_x,
                            nullptr, squares_mid},
                           stream, programmatic);
            if (attention != nullptr && (which < 0 || which == 4))
                CHECK_CUDA(asyncrl_decode::launch_paged_decode(attention->params(layer), 64, 4, 3, stream));
            if (which < 0 || which == 1)
                o.launch(attended_source, w_o + layer * o_weights,
                         {x_mid, nullptr, x, m, kHidden, kHidden, kEps, nullptr, squares_mid, nullptr}, stream, programmatic);
            if (which < 0 || which == 2)
                gate_up.launch(x_mid, w_gate_up + layer * gate_up_weights,
                               {h, nullptr, nullptr, m, kInter, kHidden, kEps, squares_mid, nullptr, squares_x}, stream,
                               programmatic);
            if (which < 0 || which == 3)
                down.launch(h, w_down + layer * down_weights,
                            {x, nullptr, x_mid, m, kHidden, kInter, kEps, nullptr, squares_x, nullptr}, stream, programmatic);
        }
    };
    const char* parts[] = {"q/k/v", "o", "gate/up", "down", "attention"};
    double sum = 0.0;
    for (int which = 0; which < (attention != nullptr ? 5 : 4); ++which) {
        const double us = graph_median_ms([&](cudaStream_t stream) { enqueue(stream, which); }, 20) * 1e3 / layers;
        sum += us;
        std::printf("chain %-8s alone %6.2f us per layer\n", parts[which], us);
    }
    const double us = graph_median_ms([&](cudaStream_t stream) { enqueue(stream, -1); }, 20) * 1e3 / layers;
    std::printf("chain layer%s%s (%s | %s | %s | %s): %6.2f us per layer (the parts alone sum to %.2f)\n",
                attention != nullptr ? " with attention" : "", programmatic ? ", programmatic" : "", qkv_name, o_name,
                gate_up_name, down_name, us, sum);
    for (void* pointer : {static_cast<void*>(x), static_cast<void*>(qkv_out), static_cast<void*>(attended),
                          static_cast<void*>(x_mid), static_cast<void*>(h), static_cast<void*>(w_qkv),
                          static_cast<void*>(b_qkv), static_cast<void*>(w_o), static_cast<void*>(w_gate_up),
                          static_cast<void*>(w_down), static_cast<void*>(squares_x), static_cast<void*>(squares_mid)})
        CHECK_CUDA(cudaFree(pointer));
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
        for (bool programmatic : {false, true}) {
            time_chain("stats + bias BN 32, BM 128, 8 st", "residual BN 32, BM 128, 8 st",
                       "stats + SwiGLU BN 80, BM 256, 5 st", "residual BN 64, BM 128, 8 st, split 4", programmatic,
                       &attention);
            time_chain("stats + bias BN 32, BM 128, 4 st", "residual BN 32, BM 128, 4 st",
                       "stats + SwiGLU BN 80, BM 256, 3 st", "residual BN 64, BM 128, 4 st, split 4", programmatic,
                       &attention);
        }
        return 0;
    }
    std::fprintf(stderr, "usage: %s check | time | layer\n", argv[0]);
    return 2;
}
