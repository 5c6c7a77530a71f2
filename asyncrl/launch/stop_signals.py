"""SIGTERM and SIGINT as a request to stop after the current step (the loop then saves a checkpoint).

    with StopSignals() as stop:
        while not stop.requested and ...: ...

The composition root hands one to the run (`Runtime.stop`); the training loop enters it around its steps.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

logger = logging.getLogger(__name__)


class StopSignals:
    """While active, the first SIGTERM or SIGINT only asks the loop to stop after the current step (a
    second SIGINT raises KeyboardInterrupt as usual). Outside the main thread it does nothing."""

    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""
        self.previous: dict[int, Any] = {}

    def handle(self, number: int, frame: Any) -> None:
        if self.requested and number == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = signal.Signals(number).name
        logger.warning("%s received: stopping after the current step, with a checkpoint", self.signal_name)

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGTERM, signal.SIGINT):
                self.previous[number] = signal.signal(number, self.handle)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for number, handler in self.previous.items():
            signal.signal(number, handler)
