"""Every cuBLASLt algorithm its heuristic offers for the decode step's products, timed the way a step runs them.

    python benchmarks/cublaslt_algos.py [--rows 256] [--models qwen2.5-0.5b] [--count 64]

`F.linear` takes cuBLAS's first heuristic choice. For the few-row products of a decode step that choice may
not be the fastest: this script asks cuBLASLt (through ctypes, from the library torch already loaded) for up to
`--count` algorithms per shape, times each over 24 distinct weights in one CUDA graph (weights from HBM, as in a
step), checks its result against `F.linear`, and prints the fastest few next to `F.linear`. It answers how much
an autotuned choice of cuBLASLt algorithm could take off the step before any of it is wired into the engine.
"""

from __future__ import annotations

import argparse
import ctypes

import torch
import torch.nn.functional as F

from asyncrl.bench.graph_timing import graph_replay_ms
from asyncrl.bench.models import qwen2_config
from decode_gemms import NUM_LAYERS, layer_shapes  # benchmarks/, on the path when run as a script
COMPUTE_32F, R_32F, R_16BF = 68, 0, 14  # cublasComputeType_t, cudaDataType_t
DESC_TRANSA, DESC_TRANSB = 3, 4  # cublasLtMatmulDescAttributes_t
OP_N, OP_T = 0, 1
PREF_MAX_WORKSPACE_BYTES = 1  # cublasLtMatmulPreferenceAttributes_t
CAP_SPLITK_SUPPORT, CAP_REDUCTION_MASK, CAP_TILE_IDS, CAP_CUSTOM_OPTION_MAX, CAP_STAGES_IDS = 0, 1, 6, 7, 13
CONFIG_TILE, CONFIG_SPLITK, CONFIG_REDUCTION, CONFIG_CUSTOM, CONFIG_STAGES = 1, 2, 3, 5, 6
SEARCH_SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)
ALGO_CONFIG = {"id": 0, "tile": 1, "splitk": 2, "reduction": 3, "swizzle": 4, "custom": 5, "stages": 6,
               "inner": 7, "cluster": 8}  # cublasLtMatmulAlgoConfigAttributes_t
WORKSPACE_BYTES = 64 << 20


class Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class HeuristicResult(ctypes.Structure):
    _fields_ = [("algo", Algo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves_count", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def load_cublaslt() -> ctypes.CDLL:
    """The libcublasLt torch itself loaded (found in this process's memory map after one product)."""
    torch.ones(8, 8, device="cuda", dtype=torch.bfloat16) @ torch.ones(8, 8, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libcublasLt.so" in line}
    if not paths:
        raise RuntimeError("libcublasLt is not loaded in this process; cannot time its algorithms")
    return ctypes.CDLL(sorted(paths)[0])


def check(status: int, call: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLASLt {call} returned status {status}")


class LtProduct:
    """y (M, N) = x (M, K) @ w (N, K)^T in bf16 with fp32 accumulation, as column-major y^T = w^T^T x^T."""

    def __init__(self, lib: ctypes.CDLL, rows: int, inner: int, outputs: int) -> None:
        self.lib, self.rows, self.outputs = lib, rows, outputs
        self.handle = ctypes.c_void_p()
        check(lib.cublasLtCreate(ctypes.byref(self.handle)), "Create")
        self.desc = ctypes.c_void_p()
        check(lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), COMPUTE_32F, R_32F), "MatmulDescCreate")
        for attribute, value in ((DESC_TRANSA, OP_T), (DESC_TRANSB, OP_N)):
            flag = ctypes.c_int32(value)
            check(lib.cublasLtMatmulDescSetAttribute(self.desc, attribute, ctypes.byref(flag), 4), "DescSetAttribute")
        self.layouts = []
        for rows_, cols, lead in ((inner, outputs, inner), (inner, rows, inner), (outputs, rows, outputs)):
            layout = ctypes.c_void_p()
            check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), R_16BF, ctypes.c_uint64(rows_),
                                                 ctypes.c_uint64(cols), ctypes.c_int64(lead)), "LayoutCreate")
            self.layouts.append(layout)
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def heuristics(self, count: int) -> list[HeuristicResult]:
        preference = ctypes.c_void_p()
        check(self.lib.cublasLtMatmulPreferenceCreate(ctypes.byref(preference)), "PreferenceCreate")
        size = ctypes.c_uint64(WORKSPACE_BYTES)
        check(self.lib.cublasLtMatmulPreferenceSetAttribute(preference, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(size), 8),
              "PreferenceSetAttribute")
        results, returned = (HeuristicResult * count)(), ctypes.c_int(0)
        weight_layout, input_layout, output_layout = self.layouts
        check(self.lib.cublasLtMatmulAlgoGetHeuristic(self.handle, self.desc, weight_layout, input_layout,
                                                       output_layout, output_layout, preference, count, results,
                                                       ctypes.byref(returned)), "AlgoGetHeuristic")
        return [results[index] for index in range(returned.value) if results[index].state == 0]

    def _capability(self, algo: Algo, attribute: int) -> list[int]:
        written = ctypes.c_size_t(0)
        self.lib.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), attribute, None, 0, ctypes.byref(written))
        values = (ctypes.c_uint32 * max(1, written.value // 4))()
        check(self.lib.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), attribute, values, 4 * len(values),
                                                          ctypes.byref(written)), "AlgoCapGetAttribute")
        return list(values)[:written.value // 4]

    def search(self, limit: int) -> list[HeuristicResult]:
        """Configurations beyond the heuristic's: every algorithm id x tile x split-K count (with each
        reduction scheme) x custom option that `cublasLtMatmulAlgoCheck` accepts, stages left to the library."""
        ids, returned = (ctypes.c_int * 256)(), ctypes.c_int(0)
        check(self.lib.cublasLtMatmulAlgoGetIds(self.handle, COMPUTE_32F, R_32F, R_16BF, R_16BF, R_16BF, R_16BF, 256,
                                                ids, ctypes.byref(returned)), "AlgoGetIds")
        weight_layout, input_layout, output_layout = self.layouts
        accepted = []
        for algo_id in list(ids)[:returned.value]:
            base = Algo()
            if self.lib.cublasLtMatmulAlgoInit(self.handle, COMPUTE_32F, R_32F, R_16BF, R_16BF, R_16BF, R_16BF,
                                               algo_id, ctypes.byref(base)) != 0:
                continue
            tiles = self._capability(base, CAP_TILE_IDS) or [0]
            split_support = self._capability(base, CAP_SPLITK_SUPPORT)[:1] == [1]
            reduction_mask = (self._capability(base, CAP_REDUCTION_MASK) or [0])[0]
            schemes = [bit for bit in (1, 2, 4) if reduction_mask & bit] or [0]
            custom_max = (self._capability(base, CAP_CUSTOM_OPTION_MAX) or [0])[0]
            for tile in tiles:
                for splits in SEARCH_SPLITS if split_support else (1,):
                    for scheme in schemes if splits > 1 else (0,):
                        for custom in range(custom_max + 1):
                            algo = Algo()
                            ctypes.memmove(ctypes.byref(algo), ctypes.byref(base), ctypes.sizeof(Algo))
                            for attribute, value in ((CONFIG_TILE, tile), (CONFIG_SPLITK, splits),
                                                     (CONFIG_REDUCTION, scheme), (CONFIG_CUSTOM, custom)):
                                field = ctypes.c_uint32(value)
                                self.lib.cublasLtMatmulAlgoConfigSetAttribute(ctypes.byref(algo), attribute,
                                                                              ctypes.byref(field), 4)
                            result = HeuristicResult()
                            if self.lib.cublasLtMatmulAlgoCheck(self.handle, self.desc, weight_layout, input_layout,
                                                                output_layout, output_layout, ctypes.byref(algo),
                                                                ctypes.byref(result)) != 0:
                                continue
                            if result.workspace_size > WORKSPACE_BYTES:
                                continue
                            result.algo = algo
                            accepted.append(result)
                            if len(accepted) >= limit:
                                return accepted
        return accepted

    def describe(self, algo: Algo) -> str:
        fields = []
        for name, attribute in ALGO_CONFIG.items():
            value, written = ctypes.c_int32(0), ctypes.c_size_t(0)
            if self.lib.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(algo), attribute, ctypes.byref(value), 4,
                                                             ctypes.byref(written)) == 0:
                fields.append(f"{name}={value.value}")
        return " ".join(fields)

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, algo: Algo) -> None:
        weight_layout, input_layout, output_layout = self.layouts
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        check(self.lib.cublasLtMatmul(self.handle, self.desc, ctypes.byref(self.alpha),
                                      ctypes.c_void_p(weight.data_ptr()), weight_layout,
                                      ctypes.c_void_p(x.data_ptr()), input_layout, ctypes.byref(self.beta),
                                      ctypes.c_void_p(out.data_ptr()), output_layout,
                                      ctypes.c_void_p(out.data_ptr()), output_layout, ctypes.byref(algo),
                                      ctypes.c_void_p(self.workspace.data_ptr()), ctypes.c_size_t(WORKSPACE_BYTES),
                                      stream), "Matmul")


def shapes_with_lm_head(model: str) -> list[tuple[str, int, int]]:
    config = qwen2_config(model)
    return layer_shapes(model) + [("lm_head", config.hidden_size, config.vocab_size)]


def time_shape(lib: ctypes.CDLL, rows: int, inner: int, outputs: int, count: int, show: int,
               search: int) -> tuple[float, float]:
    layers = 2 if outputs > 100_000 else NUM_LAYERS  # the LM head's weight alone is larger than L2
    x = torch.randn(rows, inner, device="cuda", dtype=torch.bfloat16)
    weights = [torch.randn(outputs, inner, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(layers)]
    out = torch.empty(rows, outputs, device="cuda", dtype=torch.bfloat16)
    reference = F.linear(x, weights[0]).float()
    baseline = graph_replay_ms(lambda: [torch.mm(x, weight.t(), out=out) for weight in weights], replays=20) * 1e3 / layers
    product = LtProduct(lib, rows, inner, outputs)
    timed = []
    candidates = product.heuristics(count)
    if search:
        found = product.search(search)
        print(f"  the search found {len(found)} configurations cuBLASLt accepts")
        candidates += found
    for result in candidates:
        try:
            out.fill_(float("nan"))
            product(x, weights[0], out, result.algo)
            torch.cuda.synchronize()
            error = ((out.float() - reference).norm() / reference.norm()).item()
            if not error < 1e-2:
                print(f"    rejected ({product.describe(result.algo)}): relative error {error}")
                continue
            microseconds = graph_replay_ms(lambda: [product(x, weight, out, result.algo) for weight in weights],
                                           replays=5 if search else 20) * 1e3 / layers
        except RuntimeError as failure:
            print(f"    failed ({product.describe(result.algo)}): {failure}")
            continue
        timed.append((microseconds, product.describe(result.algo), result.workspace_size))
    timed.sort()
    print(f"  F.linear / torch.mm {baseline:6.2f} us; {len(timed)} cuBLASLt algorithms ran; fastest:")
    for microseconds, description, workspace in timed[:show]:
        print(f"    {microseconds:6.2f} us  {description} workspace={workspace}")
    return baseline, timed[0][0] if timed else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="*", default=[256])
    parser.add_argument("--models", nargs="*", default=["qwen2.5-0.5b", "qwen2.5-1.5b"])
    parser.add_argument("--count", type=int, default=64, help="algorithms to ask the heuristic for")
    parser.add_argument("--show", type=int, default=4)
    parser.add_argument("--search", type=int, default=0,
                        help="also time up to this many configurations of an exhaustive search per shape")
    options = parser.parse_args()
    lib = load_cublaslt()
    for model in options.models:
        for rows in options.rows:
            totals = [0.0, 0.0]
            for name, inner, outputs in shapes_with_lm_head(model):
                print(f"{model} {name} M={rows} K={inner} N={outputs}")
                baseline, best = time_shape(lib, rows, inner, outputs, options.count, options.show,
                                            0 if name == "lm_head" else options.search)
                if name != "lm_head":
                    totals[0] += baseline
                    totals[1] += best
            print(f"{model} M={rows} layer's four: F.linear {totals[0]:.1f} us, best cuBLASLt {totals[1]:.1f} us")


if __name__ == "__main__":
    main()
