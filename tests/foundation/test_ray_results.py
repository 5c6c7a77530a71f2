"""Results of the trainer ranks as Ray hands them back: read-only views into its object store."""

import warnings

import numpy as np
import torch

from asyncrl.core.trainer_group import tensor_of


def test_a_read_only_result_from_the_object_store_becomes_a_tensor_without_a_warning(ray_session):
    array = np.arange(64 * 1024, dtype=np.float32).reshape(256, 256)  # large enough to live in the object store
    result = ray_session.get(ray_session.put(array))
    assert not result.flags.writeable  # what torch.from_numpy warns about ("NumPy array is not writable")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tensor = tensor_of(result)
    tensor[0, 0] = -1.0  # the tensor owns writable memory; Ray's copy is untouched
    assert result[0, 0] == 0.0 and torch.equal(tensor[1:], torch.from_numpy(array[1:]))


def test_a_writable_array_is_shared_not_copied():
    array = np.zeros(4, dtype=np.float32)
    tensor_of(array)[0] = 3.0
    assert array[0] == 3.0
