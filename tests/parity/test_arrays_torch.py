"""bfloat16 safetensors as torch reads them."""

import ml_dtypes
import numpy as np
import torch
from safetensors.torch import load as torch_load

from posenc.service.codec.encode import encode_safetensors

BF16 = np.array([[1.0, -2.5], [0.15625, 3e38]], dtype=ml_dtypes.bfloat16)


def test_bfloat16_safetensors_load_in_torch() -> None:
    loaded = torch_load(encode_safetensors({"x": BF16}, {}))["x"]
    assert loaded.dtype == torch.bfloat16
    np.testing.assert_array_equal(loaded.float().numpy(), BF16.astype(np.float32))
