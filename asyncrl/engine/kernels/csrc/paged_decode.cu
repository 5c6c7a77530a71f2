// The torch entry of the paged decode-attention kernel (`paged_decode_kernel.cuh`); `cuda_decode.py` builds it
// with torch's extension builder and calls `paged_decode` on the current stream.

#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "paged_decode_kernel.cuh"

torch::Tensor paged_decode(torch::Tensor query, torch::Tensor key_cache, torch::Tensor value_cache,
                           torch::Tensor block_tables, torch::Tensor context_lens, torch::Tensor new_key,
                           torch::Tensor new_value, torch::Tensor write_slots, std::optional<torch::Tensor> row_order,
                           std::optional<torch::Tensor> cos, std::optional<torch::Tensor> sin, int64_t warps,
                           int64_t stages, bool programmatic) {
    const int64_t num_sequences = query.size(0), num_heads = query.size(1), head_dim = query.size(2);
    const int64_t block_size = key_cache.size(1), num_kv_heads = key_cache.size(2);
    TORCH_CHECK(query.scalar_type() == torch::kBFloat16 && key_cache.scalar_type() == torch::kBFloat16 &&
                    value_cache.scalar_type() == torch::kBFloat16 && new_key.scalar_type() == torch::kBFloat16 &&
                    new_value.scalar_type() == torch::kBFloat16,
                "paged_decode (CUDA): bf16 tensors only");
    TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 && context_lens.scalar_type() == torch::kInt32 &&
                    write_slots.scalar_type() == torch::kInt64,
                "paged_decode (CUDA): int32 block tables and context lengths, int64 write slots");
    TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(1) >= 1 && block_tables.stride(1) == 1,
                "paged_decode (CUDA): block tables (sequences, width >= 1), rows contiguous");
    // Messages are built as one std::string: formatting integers through c10's stream in this extension crashed
    // the process on the H200 image (a segmentation fault in libstdc++'s ostream) instead of raising.
    TORCH_CHECK(head_dim == 64 || head_dim == 128,
                std::string("paged_decode (CUDA): head dimension 64 or 128, got ") + std::to_string(head_dim));
    TORCH_CHECK(block_size % asyncrl_decode::kTile == 0 && (block_size & (block_size - 1)) == 0,
                std::string("paged_decode (CUDA): block size a power of two, at least 16, got ") +
                    std::to_string(block_size));
    const int64_t group_size = num_heads / num_kv_heads;
    TORCH_CHECK(group_size * num_kv_heads == num_heads && group_size <= 8,
                "paged_decode (CUDA): at most 8 query heads per kv head");
    TORCH_CHECK(warps == 4 || warps == 8, "paged_decode (CUDA): 4 or 8 warps");
    TORCH_CHECK(stages >= 2 && stages <= 4, "paged_decode (CUDA): 2 to 4 stages");
    TORCH_CHECK(key_cache.strides() == value_cache.strides(), "paged_decode (CUDA): key and value caches alike");
    for (const torch::Tensor* tensor : {&query, &key_cache, &new_key, &new_value}) {
        // 16-byte vector loads: the head dimension contiguous, every other stride and the start 8-aligned.
        TORCH_CHECK(tensor->stride(-1) == 1 && reinterpret_cast<uintptr_t>(tensor->data_ptr()) % 16 == 0,
                    "paged_decode (CUDA): head dimension contiguous and 16-byte aligned");
        for (int64_t axis = 0; axis + 1 < tensor->dim(); ++axis)
            TORCH_CHECK(tensor->stride(axis) % 8 == 0, "paged_decode (CUDA): strides multiples of 8 elements");
    }
    TORCH_CHECK(reinterpret_cast<uintptr_t>(value_cache.data_ptr()) % 16 == 0, "paged_decode (CUDA): aligned cache");
    TORCH_CHECK(cos.has_value() == sin.has_value(), "paged_decode (CUDA): cos and sin together or neither");
    if (cos.has_value()) {
        TORCH_CHECK(cos->scalar_type() == torch::kBFloat16 && sin->scalar_type() == torch::kBFloat16 &&
                        cos->dim() == 2 && cos->size(0) == num_sequences && cos->size(1) == head_dim &&
                        sin->sizes() == cos->sizes() && sin->strides() == cos->strides(),
                    "paged_decode (CUDA): cos and sin bf16 (sequences, head dimension), alike");
        for (const torch::Tensor* tensor : {&*cos, &*sin})
            TORCH_CHECK(tensor->stride(1) == 1 && tensor->stride(0) % 8 == 0 &&
                            reinterpret_cast<uintptr_t>(tensor->data_ptr()) % 16 == 0,
                        "paged_decode (CUDA): cos/sin rows contiguous, 16-byte aligned");
    }
    auto output = torch::empty({num_sequences, num_heads, head_dim}, query.options());
    auto bf16 = [](const torch::Tensor& tensor) { return reinterpret_cast<__nv_bfloat16*>(tensor.data_ptr()); };
    asyncrl_decode::DecodeParams params{};
    params.query = bf16(query);
    params.query_stride_sequence = query.stride(0);
    params.query_stride_head = query.stride(1);
    params.new_key = bf16(new_key);
    params.new_key_stride_sequence = new_key.stride(0);
    params.new_key_stride_head = new_key.stride(1);
    params.new_value = bf16(new_value);
    params.new_value_stride_sequence = new_value.stride(0);
    params.new_value_stride_head = new_value.stride(1);
    params.write_slots = write_slots.data_ptr<int64_t>();
    params.cos = cos.has_value() ? bf16(*cos) : nullptr;
    params.sin = sin.has_value() ? bf16(*sin) : nullptr;
    params.rotary_stride = cos.has_value() ? cos->stride(0) : 0;
    params.key_cache = bf16(key_cache);
    params.value_cache = bf16(value_cache);
    params.stride_block = key_cache.stride(0);
    params.stride_token = key_cache.stride(1);
    params.stride_head = key_cache.stride(2);
    params.block_size = static_cast<int>(block_size);
    params.block_shift = __builtin_ctzll(static_cast<unsigned long long>(block_size));
    params.block_tables = block_tables.data_ptr<int>();
    params.stride_table = block_tables.stride(0);
    params.table_width = static_cast<int>(block_tables.size(1));
    params.context_lens = context_lens.data_ptr<int>();
    params.row_order = row_order.has_value() ? row_order->data_ptr<int>() : nullptr;
    params.output = bf16(output);
    params.output_stride_sequence = output.stride(0);
    params.output_stride_head = output.stride(1);
    params.num_sequences = static_cast<int>(num_sequences);
    params.num_kv_heads = static_cast<int>(num_kv_heads);
    params.group_size = static_cast<int>(group_size);
    params.scale_log2 = static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(head_dim)));
    const cudaError_t status = asyncrl_decode::launch_paged_decode(
        params, static_cast<int>(head_dim), static_cast<int>(warps), static_cast<int>(stages), programmatic,
        c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(status == cudaSuccess, std::string("paged_decode (CUDA): launch with ") + std::to_string(warps) +
                                           " warps and " + std::to_string(stages) + " stages failed: " +
                                           cudaGetErrorString(status));
    return output;
}
