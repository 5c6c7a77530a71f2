"""asyncrl: RL post-training for language models in sync, one-step-off and fully-async modes."""

__version__ = "0.1.0"
