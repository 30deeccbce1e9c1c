"""A plan's step time as the measured model predicts it: what ``toolkit compile --explain`` and
``toolkit bench`` print beside what they measure.

The plan's steps are simulated as the plan runs them (simulate.py): one after another when each
op is split across the cores (the default), in the plan's own waves when branches run side by
side (``TOOLKIT_CONCURRENT=1``), each device's steps on its own thread, waiting for the other
devices' steps as the plan's group schedule says, plus what the groups cost to start and to
wait (``MeasuredModel.group_seconds``), where host devices run as core groups
(runtime/device_groups.py). A run's copies of its inputs and the gaps between its calls
are in the measured op times (cost.py's ``profile_steps`` scales them to the whole run).
``by_device`` is the same steps with one lane per device (what a
runtime that ran each device's work apart would take), for comparison.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError
from ..runtime.device_groups import group_makespan
from .cost import MeasuredModel, measured_model
from .simulate import list_schedule, node_seconds, wave_schedule


@dataclass(frozen=True)
class Prediction:
    seconds: float               # the predicted step time of the plan as it runs
    by_device: float             # one lane per device
    kernels: int                 # steps simulated
    fitted: int                  # of them, timed by the fit rather than measured
    schedule: str                # how the plan runs its steps: 'serial', 'waves' or 'groups'

    def as_json(self) -> dict:
        return {"ms": round(self.seconds * 1e3, 4), "by_device_ms": round(self.by_device * 1e3, 4),
                "kernels": self.kernels, "fitted": self.fitted, "schedule": self.schedule}


def predict_plan(plan, model: MeasuredModel | None = None) -> Prediction:
    """The predicted step time of ``plan`` (built), by ``model`` or the measured model of its
    graph (measured on first use, cached after)."""
    placement = plan.build.placement
    if model is None:
        model = measured_model(plan.graph, plan.bindings, placement.default, concurrent=plan.execution.concurrent,
                               plan=plan)
    steps = list(plan.steps)
    groups = plan.schedule.groups
    if plan.execution.concurrent and plan.schedule.waves is not None:
        seconds = wave_schedule(steps, placement.node, model, plan.execution.threads, plan.schedule.waves).seconds
        how = "waves"
    elif groups is not None:
        seconds = group_makespan(groups, [node_seconds(n, placement.node(n), model) for n in steps])
        seconds += model.group_seconds(groups.cross_edges()) if hasattr(model, "group_seconds") else 0.0
        how = "groups"
    else:
        seconds = list_schedule(steps, placement.node, model, lanes="one").seconds
        how = "serial"
    by_device = list_schedule(steps, placement.node, model, lanes="device").seconds
    fitted = sum(1 for n in steps if n.op != "transfer" and not model.measured(n, placement.node(n)))
    return Prediction(seconds, by_device, len(steps), fitted, how)


def predicted_step(plan) -> dict:
    """``predict_plan`` as the commands report it (``Prediction.as_json``), or why it is not
    predicted (a device the measured model does not time): {"ms": None, "why_not": ...}."""
    try:
        return predict_plan(plan).as_json()
    except KeyError as e:
        return {"ms": None, "why_not": str(e.args[0])}
    except UserError as e:       # the measurement's own plan refused (too big for the memory left)
        return {"ms": None, "why_not": str(e)}


def predicted_line(predicted: dict, size: str) -> str:
    """The line ``toolkit compile --explain`` prints."""
    if predicted["ms"] is None:
        return f"predicted step time: not predicted ({predicted['why_not']})"
    how = {"serial": "its steps one after another", "waves": "its waves on the threads",
           "groups": "each device's steps on its own cores"}[predicted["schedule"]]
    measured = predicted["kernels"] - predicted["fitted"]
    return (f"predicted step time at {size}: {predicted['ms']:.3f} ms by the measured cost model, the plan running "
            f"{how} ({measured} of {predicted['kernels']} kernels timed on this machine, {predicted['fitted']} "
            f"fitted); {predicted['by_device_ms']:.3f} ms were each device's nodes run apart")
