"""`DecodeStaging`: a decode step's arrays land at their fields' places, padding rows get the sink-block
values, floats and 32-bit keys survive their int32 bit patterns, and the ring reuses its host buffers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asyncrl.engine.kernels.decode_staging import DecodeStaging


def step_arrays(num_rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "input_ids": rng.integers(0, 150_000, num_rows), "source_rows": rng.permutation(num_rows),
        "from_host": rng.integers(0, 2, num_rows), "positions": rng.integers(0, 4096, num_rows),
        "write_slots": rng.integers(0, 10_000, num_rows), "context_lens": rng.integers(1, 4097, num_rows),
        "row_order": rng.permutation(num_rows), "temperatures": rng.random(num_rows).astype(np.float32),
        "keys": rng.integers(0, 2**32, num_rows), "top_k": rng.integers(-1, 50, num_rows),
        "top_p": rng.random(num_rows).astype(np.float32),
    }


def test_fields_padding_and_tables_round_trip():
    staging = DecodeStaging(capacity=8, max_blocks=6, sink_slot=10_016, num_cache_slots=10_032,
                            device=torch.device("cpu"))
    for step, (num_rows, bucket, width) in enumerate([(5, 8, 3), (2, 2, 6), (3, 4, 1)]):
        arrays = step_arrays(num_rows, seed=step)
        tables = np.arange(num_rows * width, dtype=np.int32).reshape(num_rows, width) + 100 * step
        device_tables = staging.upload(arrays, num_rows, bucket, tables)
        np.testing.assert_array_equal(device_tables.numpy(), tables)
        for name, values in arrays.items():
            field = staging.field(name, bucket)
            got = field.numpy()[:num_rows]
            if name == "keys":  # uint32 keys come back through int64 & 0xFFFFFFFF, as the graph reads them
                got = (field.long() & 0xFFFFFFFF).numpy()[:num_rows]
            np.testing.assert_array_equal(got, values, err_msg=name)
        assert (staging.field("thresholds", bucket).numpy() == -np.inf).all()
        padding = slice(num_rows, bucket)
        assert (staging.field("write_slots", bucket).numpy()[padding] == 10_016).all()
        assert (staging.field("context_lens", bucket).numpy()[padding] == 1).all()
        assert (staging.field("from_host", bucket).numpy()[padding] == 1).all()
        assert (staging.field("input_ids", bucket).numpy()[padding] == 0).all()
        np.testing.assert_array_equal(staging.field("row_order", bucket).numpy()[padding], np.arange(num_rows, bucket))
    assert staging.next_slot == 1  # three uploads through a ring of two


def test_a_cache_beyond_int32_slots_is_refused():
    with pytest.raises(ValueError, match="int32"):
        DecodeStaging(capacity=4, max_blocks=2, sink_slot=2**31, num_cache_slots=2**31 + 16,
                      device=torch.device("cpu"))
