"""The engine's fast paths, apart from its readable core: the CUDA and Triton kernels, their builds, the fused decode
layers and the CUDA graphs of the decode step. `selection.py` is the one door: `ModelRunner` asks it once which of
them run (none on CPU, where the torch paths of `attention.py` and `sampler.py` do).

    selection.py       the choice (`KernelChoice`), from the engine config and the device
    cuda_decode.py     paged decode attention as our CUDA C++ kernel (`csrc/paged_decode*`), built on first use
    triton_decode.py   the same in Triton: the fallback, and the calls the CUDA kernel does not cover
    cuda_sampler.py    the fused Gumbel-max sampler as our CUDA kernel (`csrc/gumbel_sample.cu`)
    triton_sampler.py  the same in Triton: its fallback
    fused_decode.py    a decode step's layers as four fused CUDA products each (`csrc/fused_product*`; Hopper)
    cuda_graph.py      the decode step captured and replayed as CUDA graphs, per batch-size bucket
    decode_staging.py  the graphed step's inputs, uploaded in one copy
    cuda_build.py      builds the CUDA extensions of `csrc/` with torch's extension builder

Nothing here is imported by the core but `selection.py`, and `selection.py` imports the modules that need triton
only once a CUDA engine asks for them: CPU installs may lack triton.
"""
