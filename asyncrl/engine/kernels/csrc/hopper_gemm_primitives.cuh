// Hopper building blocks of the fused decode products (fused_product_kernel.cuh), free of torch so that they also
// build with plain nvcc: `wgmma` on shared-memory operands in the 128-byte swizzle, cp.async and
// TMA copies into that layout, mbarrier waits, a warpgroup's accumulators stored to global memory, and the row
// pitch of a tile staged in shared memory. sm_90a only (`-gencode arch=compute_90a,code=sm_90a`).
//
// Failures on the host (a CUDA call, the tensor map's encoding) go through HOPPER_REQUIRE(condition, message): a
// plain nvcc build prints and exits; the torch extension defines it as TORCH_CHECK before including this file.

#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#ifndef HOPPER_REQUIRE
#define HOPPER_REQUIRE(condition, message)              \
    do {                                                \
        if (!(condition)) {                             \
            std::fprintf(stderr, "%s\n", (message));    \
            std::exit(1);                               \
        }                                               \
    } while (0)
#endif
#define HOPPER_CUDA(call)                                                   \
    do {                                                                    \
        const cudaError_t hopper_status_ = (call);                          \
        HOPPER_REQUIRE(hopper_status_ == cudaSuccess, cudaGetErrorString(hopper_status_)); \
    } while (0)

// The wgmma wrappers below were generated (one per N; D += A x B, both operands K-major in shared memory).
__device__ __forceinline__ void wgmma_m64n32k16(float* d, uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(desc_a), "l"(desc_b), "r"(1));
}

__device__ __forceinline__ void wgmma_m64n64k16(float* d, uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(1));
}

__device__ __forceinline__ void wgmma_m64n80k16(float* d, uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, %40, %41, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
        : "l"(desc_a), "l"(desc_b), "r"(1));
}

__device__ __forceinline__ void wgmma_m64n96k16(float* d, uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, %48, %49, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
        : "l"(desc_a), "l"(desc_b), "r"(1));
}

__device__ __forceinline__ void wgmma_m64n128k16(float* d, uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(1));
}


template <int BN>
__device__ __forceinline__ void wgmma_tile(float* d, uint64_t desc_a, uint64_t desc_b) {
    if constexpr (BN == 32) wgmma_m64n32k16(d, desc_a, desc_b);
    else if constexpr (BN == 64) wgmma_m64n64k16(d, desc_a, desc_b);
    else if constexpr (BN == 80) wgmma_m64n80k16(d, desc_a, desc_b);
    else if constexpr (BN == 96) wgmma_m64n96k16(d, desc_a, desc_b);
    else wgmma_m64n128k16(d, desc_a, desc_b);
}

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// A K-major operand in the 128-byte swizzle: start address, leading byte offset 16 (unused by this layout),
// stride byte offset 1024 (eight 128-byte rows), layout type 1 (128-byte swizzle) in bits 62-63.
__device__ __forceinline__ uint64_t smem_descriptor(uint32_t address) {
    return static_cast<uint64_t>((address & 0x3FFFF) >> 4) | (static_cast<uint64_t>(16 >> 4) << 16) |
           (static_cast<uint64_t>(1024 >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void copy_16(uint32_t destination, const void* source, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(destination), "l"(source),
                 "r"(valid ? 16 : 0));
}

// One 64-wide block of K for a warpgroup's 128 rows of the tile: four k16 steps x two m64 products, committed as
// one wgmma group (the caller waits for it).
template <int BN>
__device__ __forceinline__ void multiply_block(float (&accumulators)[2][BN / 2], uint32_t tile_a, uint32_t tile_b,
                                               int warpgroup) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int step = 0; step < 4; ++step) {
        const uint64_t desc_b = smem_descriptor(tile_b + step * 32);
#pragma unroll
        for (int half = 0; half < 2; ++half)
            wgmma_tile<BN>(accumulators[half], smem_descriptor(tile_a + (warpgroup * 128 + half * 64) * 128 + step * 32),
                           desc_b);
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// A warpgroup's accumulators stored straight to C as bf16 pairs, rows from `row0`. The accumulator layout of
// m64nN: per 8 columns, {(g, 2q), (g, 2q + 1), (g + 8, 2q), (g + 8, 2q + 1)} for lane 4g + q, warp w of the
// warpgroup adding 16 w rows.
template <int BN>
__device__ __forceinline__ void store_accumulators(const float (&accumulators)[2][BN / 2], __nv_bfloat16* c, int m,
                                                   int n, int row0, int n0) {
    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = row0 + half * 64 + warp * 16 + g;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            const int column = n0 + j * 8 + q * 2;
            if (column >= n) continue;
            const float* values = &accumulators[half][j * 4];
            if (row < m)
                *reinterpret_cast<__nv_bfloat162*>(c + static_cast<size_t>(row) * n + column) =
                    __floats2bfloat162_rn(values[0], values[1]);
            if (row + 8 < m)
                *reinterpret_cast<__nv_bfloat162*>(c + static_cast<size_t>(row + 8) * n + column) =
                    __floats2bfloat162_rn(values[2], values[3]);
        }
    }
}

__device__ __forceinline__ void barrier_wait(uint32_t barrier, uint32_t phase) {
    uint32_t done = 0;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(barrier), "r"(phase)
            : "memory");
    } while (!done);
}

__device__ __forceinline__ void tma_load_2d(uint32_t destination, const CUtensorMap* map, int inner, int outer,
                                            uint32_t barrier) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
            "r"(destination),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(inner), "r"(outer), "r"(barrier)
        : "memory");
}

// A row-major (rows, k) bf16 matrix as TMA boxes of 64 columns x box_rows rows in the 128-byte swizzle.
inline CUtensorMap tensor_map(const __nv_bfloat16* matrix, int rows, int k, int box_rows) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
    if (encode == nullptr) {
        cudaDriverEntryPointQueryResult found;
        HOPPER_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", reinterpret_cast<void**>(&encode),
                                                     12000, cudaEnableDefault, &found));
        HOPPER_REQUIRE(found == cudaDriverEntryPointSuccess, "cuTensorMapEncodeTiled not found");
    }
    CUtensorMap map;
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k) * sizeof(__nv_bfloat16)};
    const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
    const cuuint32_t element_strides[2] = {1, 1};
    const CUresult status = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<__nv_bfloat16*>(matrix), dims,
                                   strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                   CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    HOPPER_REQUIRE(status == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (a pointer, row stride or box it cannot take)");
    return map;
}

// Row pitch in 4-byte words of a bf16 tile `columns` wide staged in shared memory: a multiple of 4 (16-byte chunks
// stay aligned) that is 4 mod 8, so the 8 rows x 4 lanes of an accumulator write land in 32 distinct banks.
__host__ __device__ constexpr int staged_pitch_words(int columns) {
    int words = columns / 2 + 4;
    while (words % 8 != 4) words += 4;
    return words;
}
