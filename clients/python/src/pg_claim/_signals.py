"""A Worker's signals: SIGTERM and SIGINT ask it to stop."""
from __future__ import annotations

import signal
import threading
from typing import Callable


def install_signals(stop: Callable[[], None]) -> Callable[[], None]:
    """SIGTERM and SIGINT call stop() while run() runs (from the main thread
    only: elsewhere the process keeps its handlers); returns what puts the
    previous handlers back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    saved = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        saved[sig] = signal.signal(sig, lambda *_: stop())

    def restore() -> None:
        for sig, h in saved.items():
            signal.signal(sig, h)
    return restore
