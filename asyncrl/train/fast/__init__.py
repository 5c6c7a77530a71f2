"""The trainer's speed paths, apart from the worker, the losses and the readable forward: `selection.py` is the one
door through which the rest of `train/` reaches them.

    selection.py        which speed paths run: the graphed update (`actor.cuda_graphs`), the Triton LM head
    graphed_update.py   the actor's micro-batches as packed steps replayed from CUDA graphs
    packed_batch.py     a micro-batch packed into buffers of a fixed capacity (the graphs' static shapes)
    packed_forward.py   log-probs and entropies of a packed micro-batch, gradients added into the fp32 masters'
    step_graphs.py      one CUDA graph per capacity: capture on first use, replay after
    compute_weights.py  compute-dtype copies of the fp32 masters at fixed addresses (mixed precision without FSDP)
    embedding_lookup.py an embedding whose gradient rows go straight into the fp32 master's gradient
    flat_adamw.py       AdamW over the flat masters, one Triton kernel per step on CUDA (`triton_adamw.py`)
    triton_lm_head.py   the chunked LM head's softmax math as two Triton kernels
"""
