"""What asyncrl adds to every vLLM worker (`worker_extension_cls`): it joins the run's weight-sync group and
loads the trainer's weights in place, through vLLM's own loader, straight from the broadcast buckets; for a
`vllm serve` process (rollout.backend=external with rollout.external.api=vllm) it reloads an HF folder the same
way and reports the checksum of what it loaded. On a CPU it also keeps each linear layer's weight where a reload
reaches it (`keep_cpu_linear_weights`).

    vllm serve MODEL --worker-extension-cls asyncrl.rollout.vllm.worker_extension.WeightSyncExtension ...
    POST /collective_rpc {"method": "asyncrl_load_folder", "args": ["/runs/x/external_weights/v3"]}

vLLM calls these through `collective_rpc` on each worker process, which owns the model. Arguments cross
vLLM's process boundary as plain values (names, shapes, a dtype's name): vLLM serializes them, and tensors
do not survive that trip, which is why the worker receives the weights itself instead of being handed them.
"""

from __future__ import annotations

import torch

from asyncrl.models import iter_named_tensors, load_model
from asyncrl.rollout.external_weights import weights_checksum
from asyncrl.rollout.weight_transport import TransferPlan, WeightReceiver, create_group


def keep_cpu_linear_weights() -> None:
    """vLLM's CPU build packs each linear layer's weight into a oneDNN (or AMX) handle when it loads a model, and
    drops the weight; its in-place reload does not rebuild those handles, so after a reload the layers (the tied
    LM head too) still compute with the weights first loaded (log-probs 0.5 off after one reload). On a CPU this
    replaces that packing with torch's linear over the layer's own weight, which every reload reaches. vLLM
    imports this module in each worker before it loads the model (`worker_extension_cls`), so the model is built
    this way from the start; layers that are not 2-D matrices keep vLLM's handling."""
    from vllm.platforms import current_platform
    if not current_platform.is_cpu():
        return
    import vllm.model_executor.layers.utils as layer_utils
    packing = layer_utils.dispatch_cpu_unquantized_gemm

    def plain_linear(layer: torch.nn.Module, remove_weight: bool) -> None:
        if layer.weight.is_meta or layer.weight.ndim != 2:
            packing(layer, remove_weight)
            return
        layer.cpu_linear = torch.nn.functional.linear

    layer_utils.dispatch_cpu_unquantized_gemm = plain_linear


keep_cpu_linear_weights()


def served_checksum(model: torch.nn.Module, dtype: torch.dtype, folder: str) -> dict[str, str]:
    """What the checksum route answers for `model` (read from `folder`) served in `dtype`."""
    return {"sha256": weights_checksum(iter_named_tensors(model), dtype), "dtype": str(dtype).removeprefix("torch."),
            "folder": folder}


class WeightSyncExtension:
    """Mixed into vLLM's worker class (`self.reload_weights`, `self.device`, `self.vllm_config` are the worker's)."""

    asyncrl_checksum: dict[str, str] | None = None   # of the weights last loaded from a folder

    def asyncrl_join_weight_group(self, host: str, port: int, rank: int, world_size: int,
                                  named_shapes: list[tuple[str, tuple[int, ...]]], dtype: str, bucket_bytes: int,
                                  timeout_s: float) -> None:
        device = torch.device(self.device)
        plan = TransferPlan.build(named_shapes, getattr(torch, dtype), bucket_bytes)
        self.asyncrl_receiver = WeightReceiver(create_group(host, port, rank, world_size, device, timeout_s), plan,
                                               device)

    def asyncrl_receive_weights(self, with_checksum: bool) -> tuple[int, str]:
        """Receives every tensor of the plan and loads it in place; returns how many, and (when asked) the
        checksum of what was loaded (`weights_checksum` in the transfer dtype: the trainer computes the same)."""
        kept: list[tuple[str, torch.Tensor]] = []
        count = 0

        def stream():
            nonlocal count
            for name, tensor in self.asyncrl_receiver.receive_named():
                count += 1
                if with_checksum:
                    kept.append((name, tensor))
                yield name, tensor

        self.reload_weights(weights_iterator=stream())   # the worker's: it sets the config vLLM's loaders read
        return count, weights_checksum(kept, self.asyncrl_receiver.plan.dtype) if with_checksum else ""

    def asyncrl_load_folder(self, folder: str) -> dict[str, str]:
        """Loads the HF folder's weights in place (read and checked by asyncrl's loader, then handed to vLLM's
        reload) and returns `asyncrl_weights_checksum`'s answer for them."""
        model = load_model(folder, dtype=torch.float32, device="cpu")
        self.reload_weights(weights_iterator=iter_named_tensors(model))
        self.asyncrl_checksum = served_checksum(model, self.vllm_config.model_config.dtype, folder)
        return self.asyncrl_checksum

    def asyncrl_weights_checksum(self) -> dict[str, str]:
        """The checksum (`external_weights.weights_checksum`, in the served dtype) of the weights the last
        `asyncrl_load_folder` handed to vLLM; before any, of the model folder the server started from. It is
        computed from what was read, not read back from vLLM's (fused, repacked) parameters: that the engine
        computes with them is what `asyncrl check-server`'s reload check shows."""
        if self.asyncrl_checksum is None:
            model_config = self.vllm_config.model_config
            model = load_model(model_config.model, dtype=torch.float32, device="cpu")
            self.asyncrl_checksum = served_checksum(model, model_config.dtype, model_config.model)
        return self.asyncrl_checksum

    def asyncrl_server_facts(self) -> dict[str, str]:
        """What the external backend checks of a `vllm serve` before it trains on it: the log-probs mode."""
        return {"logprobs_mode": str(self.vllm_config.model_config.logprobs_mode)}
