"""What a training run shows and records: a progress bar on a terminal (plain lines otherwise),
``metrics.jsonl`` (one JSON object per logged iteration), and the loss/metric plot PNG."""
from __future__ import annotations

import json
import math
import sys
import time
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


class Progress:
    """Iteration, loss, lr, speed and ETA: a redrawn bar on a TTY, a line every ``display`` iterations otherwise."""

    def __init__(self, total: int, start: int, display: int, stream=None):
        self.total, self.start, self.display = total, start, display
        self.line = StatusLine(stream)
        self.t0 = time.perf_counter()

    def update(self, it: int, loss: float, lr: float) -> None:
        done = it + 1 - self.start
        elapsed = time.perf_counter() - self.t0
        speed = done / elapsed if elapsed > 0 else float("inf")
        eta = (self.total - it - 1) / speed if speed > 0 else float("inf")
        if self.line.tty:
            self.line.draw(f"{bar(it + 1, self.total)} {it + 1}/{self.total} loss {loss:.4f} lr {lr:.3g} "
                           f"{speed:.1f} it/s ETA {format_time(eta)} ", last=it + 1 >= self.total)
        elif it % self.display == 0 or it + 1 == self.total:
            self.line.print(f"iter {it} loss {loss:.6f} lr {lr:.6g} {speed:.1f} it/s ETA {format_time(eta)}")

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
            for line in path.read_text().splitlines():
                try:
                    if json.loads(line).get("iter", 0) < resume_from:
                        kept.append(line)
                except json.JSONDecodeError:
                    continue
        text = "".join(k + "\n" for k in kept)
        atomic_write(path, lambda tmp: Path(tmp).write_text(text))

    def write(self, record: dict) -> None:
        append_line(self.path, json.dumps(record))

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]


def plot(records: list[dict], path: Path, title: str, metric_keys: list[str]) -> bool:
    """Training loss and each test metric against iterations; False if matplotlib is unusable."""
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
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))
    finally:
        plt.close(fig)
    return True
