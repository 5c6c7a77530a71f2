"""AdamW over a `ComputeWeights`' flat masters: on CUDA one Triton kernel per step, elsewhere torch's AdamW.

    optimizer = FlatAdamW(weights, config)      # weights: ComputeWeights (actor.cuda_graphs)
    optimizer.step()                            # CUDA: one kernel, reading `found_inf` / `grad_scale` if set

Why. The masters, their gradients and (here) both moments lie in flat buffers at the same offsets, so a step is one
pass over flat memory (`triton_adamw.adamw_step_`) instead of torch's fused kernel's 25 multi-tensor launches
over 290 tensors for a 0.5B model (4.6 ms of a 0.25 s update on an H200, ~3.0 TB/s).

It is torch's AdamW in every other respect: the same hyper-parameters and param group, the same state entries
(`step`, `exp_avg`, `exp_avg_sq` per parameter; the moments are parts of the flat buffers), so its state dict,
checkpoints and schedulers are torch's. After `load_state_dict` (which gives every entry new memory) the next step
copies the moments back into the flat buffers.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from asyncrl.config.schema import OptimConfig
from asyncrl.train.fast.compute_weights import ComputeWeights, carve


class FlatAdamW(torch.optim.AdamW):
    def __init__(self, weights: ComputeWeights, config: OptimConfig) -> None:
        params = weights.trainable_masters
        if not params:
            raise ValueError("FlatAdamW needs trainable master weights")
        on_gpu = params[0].is_cuda
        super().__init__(params, lr=config.lr, betas=tuple(config.betas), eps=config.eps,
                         weight_decay=config.weight_decay, **({"fused": True} if on_gpu else {"foreach": False}))
        self.fused_kernel = on_gpu  # steps run the Triton kernel (also on CPU tensors under TRITON_INTERPRET=1)
        self.weights = weights
        shapes = [param.shape for param in params]
        self.flat_exp_avg, self.exp_avg_parts = carve(shapes, torch.float32, params[0].device)
        self.flat_exp_avg_sq, self.exp_avg_sq_parts = carve(shapes, torch.float32, params[0].device)
        self._state_is_flat = False

    # Torch's fused AdamW reads these two from the optimizer (AMP's GradScaler sets them); `NonFiniteGuard` sets
    # them for a step, on torch's AdamW and this one alike.
    found_inf: Optional[Tensor] = None   # 0-dim 1.0 / 0.0 on the device: skip the step there
    grad_scale: Optional[Tensor] = None  # 0-dim on the device: the gradients are divided by it

    @torch.no_grad()
    def step(self, closure=None):
        """On CUDA, with the masters' gradients the flat ones: one kernel over the flat buffers, with the flags
        above. Otherwise torch's AdamW (CPU; or torch's state-dict helpers, which step once with gradients of
        their own)."""
        params = self.param_groups[0]["params"]
        flat_grads = all(param.grad is grad for param, grad in zip(params, self.weights.flat_grad_parts))
        if not (self.fused_kernel and flat_grads):
            self._state_is_flat = False  # torch's step may create state entries of its own
            return super().step(closure)
        from asyncrl.train.fast.triton_adamw import adamw_step_  # triton: CUDA installs only

        loss = None if closure is None else closure()
        self._flatten_state()
        steps = [self.state[param]["step"] for param in params]
        torch._foreach_add_(steps, 1.0)
        group = self.param_groups[0]
        adamw_step_(self.weights.flat_masters, self.weights.flat_grads, self.flat_exp_avg, self.flat_exp_avg_sq,
                    steps[0], float(group["lr"]), group["betas"], group["eps"], group["weight_decay"],
                    self.found_inf, self.grad_scale)
        if self.found_inf is not None:
            torch._foreach_sub_(steps, [self.found_inf] * len(steps))
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._state_is_flat = False

    @torch.no_grad()
    def _flatten_state(self) -> None:
        """Every parameter's moments become its parts of the flat buffers (their values kept; zeros and step 0
        for a parameter without state yet)."""
        if self._state_is_flat:
            return
        if len(self.param_groups) != 1:
            raise ValueError(f"FlatAdamW takes one param group, got {len(self.param_groups)}")
        for param, exp_avg, exp_avg_sq in zip(self.param_groups[0]["params"], self.exp_avg_parts,
                                              self.exp_avg_sq_parts):
            state = self.state[param]
            if "exp_avg" in state:  # copied, unless torch's step already updated the parts themselves
                exp_avg.copy_(state["exp_avg"])
                exp_avg_sq.copy_(state["exp_avg_sq"])
            else:  # the entries torch's fused AdamW would create
                state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
                exp_avg.zero_()
                exp_avg_sq.zero_()
            state["exp_avg"], state["exp_avg_sq"] = exp_avg, exp_avg_sq
        steps = {float(self.state[param]["step"]) for param in self.param_groups[0]["params"]}
        if len(steps) > 1:
            raise ValueError(f"FlatAdamW steps every parameter together; the loaded state has step counts "
                             f"{sorted(steps)}")
        self._state_is_flat = True
