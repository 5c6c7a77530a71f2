"""Built-in synthetic tasks a tiny model can learn on CPU, each with its scorer."""

from asyncrl.data.tasks import arithmetic, countdown

TASKS = {"arithmetic": arithmetic.ArithmeticTask, "countdown": countdown.CountdownTask}
SCORERS = {arithmetic.DATA_SOURCE: arithmetic.score, countdown.DATA_SOURCE: countdown.score}

__all__ = ["SCORERS", "TASKS"]
