"""Trainer workers: log-probs, actor and critic updates with FSDP2, checkpoints and weight export."""

from asyncrl.train.batch import TrainBatch
from asyncrl.train.data_parallel import gather_rows, shard_batch
from asyncrl.train.update_spec import CriticUpdateSpec, PolicyUpdateSpec
from asyncrl.train.worker import TrainerWorker

__all__ = ["CriticUpdateSpec", "PolicyUpdateSpec", "TrainBatch", "TrainerWorker", "gather_rows", "shard_batch"]
