"""The composition root: everything a run is built from, apart from the recipes that use it.

    modes.py          each trainer.mode's recipe (and actors); train(config): build, run the recipe, close
    runtime.py        build_runtime(config): inputs checked, Ray, pools, replicas, trainer ranks, rollout backend
    preflight.py      the model, critic and tokenizer folders checked before Ray starts
    resume_check.py   the checkpoint a run resumes from, checked against the config (and a finished run) before Ray
    ray_cluster.py    start or join the Ray cluster (a local one: loopback only, a token, SIGTERM at start-up)
    cluster_reaper.py ends a local cluster's processes when the driver dies (run as a script)
    resource_pool.py  the trainer and rollout pools, reserved in one placement group
    stop_signals.py   SIGTERM / SIGINT as a request to stop after the current step
    demo.py           `asyncrl demo`: task, tiny model, SFT warm start, then train()
"""

from asyncrl.launch.runtime import build_runtime
from asyncrl.launch.stop_signals import StopSignals
from asyncrl.launch.modes import train

__all__ = ["StopSignals", "build_runtime", "train"]
