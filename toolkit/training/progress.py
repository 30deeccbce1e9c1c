"""What a training run shows and records: a progress bar on a terminal (plain lines otherwise),
``metrics.jsonl`` (one JSON object per logged iteration), and the loss/metric plot PNG."""
from __future__ import annotations

import json
import math
import sys
import time
from collections import deque
from pathlib import Path

from ..fileio import append_line, atomic_write


def format_time(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
        else f"{seconds // 60:02d}:{seconds % 60:02d}"


def bar(done: int, total: int, width: int = 24) -> str:
    filled = int(width * done / total)
    return f"[{'#' * filled}{'-' * (width - filled)}]"


class StatusLine:
    """Where a progress display writes: on a terminal one line redrawn in place (at most every
    0.1 s, but always the last), cleared before a message and ended on close; elsewhere plain
    lines, which the caller writes only as often as it wants them kept."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.last_draw = 0.0
        self.drawn = False

    def draw(self, text: str, last: bool = False) -> None:
        now = time.perf_counter()
        if now - self.last_draw < 0.1 and not last:
            return
        self.last_draw, self.drawn = now, True
        self.stream.write("\r" + text)
        self.stream.flush()

    def print(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        if self.tty and self.drawn:
            self.stream.write("\r\x1b[2K")
        self.print(text)

    def close(self) -> None:
        if self.tty and self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False


# it/s is measured over the recent past, so that a slow start (data loading, caches warming) or a
# test pass stops weighing on the ETA after a few lines: the shortest window that spans at least
# this many iterations or seconds
WINDOW_ITERATIONS = 20
WINDOW_S = 10.0


class Speed:
    """Iterations per second over a recent window, not counting the time given to ``exclude``
    (kernel compiles, which happen once and say nothing of the steps to come)."""

    def __init__(self, done: int, now: float | None = None):
        self.excluded = 0.0
        self.samples: deque[tuple[int, float]] = deque([(done, time.perf_counter() if now is None else now)])

    def exclude(self, seconds: float) -> None:
        self.excluded += seconds

    def mark(self, done: int, now: float | None = None) -> None:
        """``done`` iterations are complete at ``now`` (default: the clock)."""
        t = (time.perf_counter() if now is None else now) - self.excluded
        self.samples.append((done, t))
        while len(self.samples) > 2:
            d1, t1 = self.samples[1]            # would the window starting there still be wide enough?
            if (done - d1 >= WINDOW_ITERATIONS and t > t1) or t - t1 >= WINDOW_S:
                self.samples.popleft()
            else:
                break

    def rate(self) -> float | None:
        """Iterations per second, or None before any time has passed."""
        (d0, t0), (d1, t1) = self.samples[0], self.samples[-1]
        if d1 <= d0 or t1 <= t0:
            return None
        return (d1 - d0) / (t1 - t0)


class Progress:
    """Iteration, epoch, loss, lr, speed and ETA: a redrawn bar on a TTY, a line every
    ``display`` iterations otherwise; a kernel compile on a line of its own, its time left out of
    the speed. ``per_epoch``: iterations per pass over the training data."""

    def __init__(self, total: int, start: int, display: int, stream=None, per_epoch: int | None = None):
        self.total, self.start, self.display = total, start, display
        self.per_epoch = per_epoch
        self.line = StatusLine(stream)
        self.speed = Speed(start)

    def epoch(self, it: int) -> str:
        """`` epoch E/TOTAL`` for iteration ``it`` (counted from 1), or nothing without epochs."""
        if not self.per_epoch:
            return ""
        return f" epoch {it // self.per_epoch + 1}/{-(-self.total // self.per_epoch)}"

    def compiled(self, what: str, seconds: float, show: bool = True) -> None:
        """A compile that took ``seconds``: left out of the iterations' speed, and (``show``) said."""
        self.speed.exclude(seconds)
        if show:
            self.line.message(f"compiling kernels {what} ... {seconds:.1f} s")

    def update(self, it: int, loss: float, lr: float) -> None:
        self.speed.mark(it + 1)
        rate = self.speed.rate()
        shown = "? it/s ETA ?" if rate is None else \
            f"{rate:.1f} it/s ETA {format_time((self.total - it - 1) / rate)}"
        if self.line.tty:
            self.line.draw(f"{bar(it + 1, self.total)} {it + 1}/{self.total}{self.epoch(it)} loss {loss:.4f} "
                           f"lr {lr:.3g} {shown} ", last=it + 1 >= self.total)
        elif it % self.display == 0 or it + 1 == self.total:
            self.line.print(f"iter {it}{self.epoch(it)} loss {loss:.6f} lr {lr:.6g} {shown}")

    def message(self, text: str) -> None:
        self.line.message(text)

    def close(self) -> None:
        self.line.close()


class MetricsLog:
    """Appends one JSON object per line; on resume, records at or past the resume point are dropped."""

    def __init__(self, path: Path, resume_from: int | None):
        self.path = path
        kept = []
        if resume_from is not None and path.exists():
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():   # bad bytes: a line dropped
                try:
                    record = json.loads(line)
                except (json.JSONDecodeError, RecursionError):
                    continue
                # a line that is no record of an iteration (edited, or half-written) is dropped too
                if isinstance(record, dict) and type(record.get("iter", 0)) in (int, float) \
                        and record.get("iter", 0) < resume_from:
                    kept.append(line)
        text = "".join(k + "\n" for k in kept)
        atomic_write(path, lambda tmp: Path(tmp).write_text(text))

    def write(self, record: dict) -> None:
        append_line(self.path, json.dumps(record))

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]


class NoLog:
    """Ranks other than 0 log nothing."""

    def write(self, record: dict) -> None:
        pass


class Silent:
    """A stream for the progress of ranks other than 0."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def plot(records: list[dict], path: Path, title: str, metric_keys: list[str]) -> bool:
    """Training loss and each test metric against iterations, as PNG (or SVG or PDF where ``path``
    ends so); False if matplotlib is unusable."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return False
    train = [(r["iter"], r["loss"]) for r in records if "loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    if train:
        ax.plot([t[0] for t in train], [t[1] for t in train], label="train loss", color="tab:blue")
    losses = [k for k in metric_keys if "loss" in k]         # test losses share the loss axis
    others = [k for k in metric_keys if k not in losses]
    for key, color in zip(losses, ("tab:orange", "tab:olive", "tab:pink", "tab:gray")):
        pts = [(r["iter"], r[key]) for r in records if key in r]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=key, color=color)
    ax.set_xlabel("iteration")
    ax.set_ylabel("loss")
    ax.set_title(title)
    handles, labels = ax.get_legend_handles_labels()
    if others:
        ax2 = ax.twinx()
        for key, color in zip(others, ("tab:green", "tab:red", "tab:purple", "tab:brown")):
            pts = [(r["iter"], r[key]) for r in records if key in r]
            ax2.plot([p[0] for p in pts], [p[1] for p in pts], marker="s", label=key, color=color)
        ax2.set_ylabel("test metric")
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    if handles:
        ax.legend(handles, labels, loc="center right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    try:
        # the format the name says (.svg for the documentation's picture), else PNG
        kind = Path(path).suffix.lstrip(".").lower()
        atomic_write(path, lambda tmp: fig.savefig(tmp, format=kind if kind in ("svg", "pdf") else "png"))
    finally:
        plt.close(fig)
    return True
