"""Built-in synthetic tasks a tiny model can learn on CPU, each with its scorer."""

from asyncrl.data.tasks import arithmetic, countdown, tool_arithmetic

TASKS = {"arithmetic": arithmetic.ArithmeticTask, "countdown": countdown.CountdownTask,
         "tool_arithmetic": tool_arithmetic.ToolArithmeticTask}
SCORERS = {arithmetic.DATA_SOURCE: arithmetic.score, countdown.DATA_SOURCE: countdown.score,
           tool_arithmetic.DATA_SOURCE: tool_arithmetic.score}

__all__ = ["SCORERS", "TASKS"]
