"""vLLM engines as rollout replicas (`rollout.backend=vllm`, docs/vllm.md):

    engine_args.py       the engine's arguments from the config (rollout.vllm), and the checks before Ray
    worker_extension.py  added to each vLLM worker: joins the weight group, loads the weights in place
    replica.py           the Ray actor hosting one vLLM engine, with the replica interface of ../replica.py
    backend.py           "vllm": the replica set over those actors (+ rollout.vllm.verify_weights)

vLLM itself is imported only inside a replica and by the checks, so this backend is registered wherever asyncrl
is installed and a run without vLLM is told what to install.
"""

from asyncrl.rollout.vllm.backend import VllmReplicaSet

__all__ = ["VllmReplicaSet"]
