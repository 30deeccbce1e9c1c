"""The ``train`` section of a net (docs/spec.md section 3): data, solver, lr policy, schedule."""
from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import Field, model_validator

from .base import Name, Number, PositiveInt, Strict


class DataSpec(Strict):
    """Where the data comes from and Caffe's transform_param: ``(x - mean) * scale``, then for
    image inputs [N, C, H, W] a ``crop_size`` square (random in training, the centre in test
    and deployment) and ``mirror`` (a random left-right flip in training)."""
    source: str = "builtin:digits"
    test_fraction: Annotated[float, Field(ge=0, lt=1)] = 0.2
    test_source: Optional[str] = None
    batch_size: PositiveInt = 64
    shuffle: bool = True
    scale: Optional[Number] = None
    mean: Optional[Union[Number, list[Number]]] = None
    mean_value: Optional[list[Number]] = None          # Caffe's name: one mean per channel
    mean_file: Optional[str] = None                    # a mean image [C, H, W] (.npy), as Caffe's
    crop_size: Optional[PositiveInt] = None
    mirror: bool = False
    root_folder: Optional[str] = None                  # an image list's paths are relative to it
    new_height: Optional[PositiveInt] = None           # an image list's images, resized before a crop
    new_width: Optional[PositiveInt] = None
    # sequences of different lengths, padded to one length T in the source: the array of each
    # example's length, or the value a step of padding holds in every feature (an extension)
    lengths: Optional[str] = None
    padding_value: Optional[Number] = None

    @model_validator(mode="after")
    def _one_mean(self):
        given = [k for k in ("mean", "mean_value", "mean_file") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of mean, mean_value and mean_file, not {' and '.join(given)}")
        if self.lengths is not None and self.padding_value is not None:
            raise ValueError("give one of lengths and padding_value, not both")
        return self


class LrPolicy(Strict):
    type: Literal["fixed", "step", "multistep", "exp", "inv", "poly", "cosine", "sigmoid"] = "fixed"
    gamma: Optional[Number] = None
    step_size: Optional[PositiveInt] = None
    milestones: Optional[list[PositiveInt]] = None
    power: Optional[Number] = None
    min_lr: Number = 0.0
    warmup_iters: Annotated[int, Field(ge=0)] = 0
    warmup_factor: Annotated[float, Field(gt=0, le=1)] = 0.1


class MixedPrecisionSpec(Strict):
    """Mixed-precision training (PyTorch's autocast + GradScaler): GEMMs and convolutions in
    ``dtype``, float32 master weights, the loss scaled by a factor that backs off on overflow."""
    dtype: Literal["float16", "bfloat16"] = "float16"
    loss_scale: Union[Literal["dynamic"], Annotated[float, Field(gt=0)]] = "dynamic"
    init_scale: Annotated[float, Field(gt=0)] = 65536.0
    growth_factor: Annotated[float, Field(gt=1)] = 2.0
    backoff_factor: Annotated[float, Field(gt=0, lt=1)] = 0.5
    growth_interval: PositiveInt = 2000


class SolverSpec(Strict):
    type: Literal["sgd", "nesterov", "adam", "adamw", "rmsprop", "adagrad", "adadelta"] = "sgd"
    base_lr: Annotated[float, Field(gt=0)] = 0.01
    momentum: Annotated[float, Field(ge=0)] = 0.0
    weight_decay: Optional[Annotated[float, Field(ge=0)]] = None
    betas: Annotated[list[float], Field(min_length=2, max_length=2)] = [0.9, 0.999]
    eps: Optional[Annotated[float, Field(gt=0)]] = None
    alpha: Annotated[float, Field(gt=0, lt=1)] = 0.99
    rho: Annotated[float, Field(gt=0, lt=1)] = 0.9          # adadelta's decay (Caffe's momentum)
    regularization: Literal["l2", "l1"] = "l2"              # weight decay's norm (Caffe's regularization_type)
    # sgd/nesterov: where the rate multiplies. pytorch: buf = m*buf + g, w -= lr*buf; caffe: the
    # rate is folded into the buffer (v = m*v + lr*g, w -= v), so past momentum keeps its old rate
    momentum_convention: Literal["pytorch", "caffe"] = "pytorch"
    lr_policy: LrPolicy = LrPolicy()
    clip_gradients: Optional[Annotated[float, Field(gt=0)]] = None
    mixed_precision: Optional[MixedPrecisionSpec] = None


class DistributedSpec(Strict):
    """Data-parallel or pipeline-parallel training under an MPI launcher (docs/spec.md section 8)."""
    sync_batchnorm: bool = False
    bucket_mb: Annotated[float, Field(gt=0)] = 25.0
    overlap: bool = True          # start each bucket's all-reduce during the backward pass
    # pipeline parallelism (training/pipeline.py): the train step cut into this many stages, one
    # per rank (a job of a multiple of them: that many data-parallel replicas of the pipeline),
    # each batch run as micro_batches micro-batches on the schedule named
    stages: PositiveInt = 1
    micro_batches: PositiveInt = 1
    schedule: Literal["gpipe", "1f1b"] = "gpipe"
    # the memory each pipeline rank may hold for its stage (weights, slots and the step's arena),
    # which the cut keeps every stage under; default: the memory available, split among the ranks
    stage_memory_mb: Optional[Annotated[float, Field(gt=0)]] = None
    # what the cut balances: the layers' time as this machine's cost model measures it (FLOPs
    # where it cannot), or their FLOPs alone (the same cut on every machine)
    balance: Literal["time", "flops"] = "time"


class BestSpec(Strict):
    """Which test metric picks ``best.safetensors``: ``mode`` min or max (default: min for a name
    with 'loss' in it, else max)."""
    metric: Name
    mode: Optional[Literal["min", "max"]] = None


class EarlyStopSpec(Strict):
    """Stop when the test metric has not improved by more than ``min_delta`` for ``patience``
    test passes in a row (Keras' EarlyStopping, Lightning's EarlyStopping)."""
    metric: Name
    mode: Optional[Literal["min", "max"]] = None
    patience: PositiveInt
    min_delta: Annotated[float, Field(ge=0)] = 0.0


class TrainSpec(Strict):
    data: DataSpec = DataSpec()
    solver: SolverSpec = SolverSpec()
    losses: Optional[list[Name]] = None
    max_iter: Optional[PositiveInt] = None
    epochs: Optional[PositiveInt] = None
    test_interval: Optional[PositiveInt] = None
    display: PositiveInt = 50
    snapshot: Optional[PositiveInt] = None
    keep_last: PositiveInt = 3
    seed: int = 0
    distributed: DistributedSpec = DistributedSpec()
    best: Optional[BestSpec] = None
    early_stop: Optional[EarlyStopSpec] = None
    tensorboard: bool = False

    @model_validator(mode="after")
    def _one_length(self):
        if self.max_iter is not None and self.epochs is not None:
            raise ValueError("give max_iter or epochs, not both (epochs: passes over the training data; "
                             "max_iter: iterations)")
        return self


# Rules that span keys of the train section. They are checked when the net file is read (the
# front end locates each at its key, as FILE:LINE:COL), so that `toolkit check` refuses what
# training would; each gives the keys it is about, the likeliest culprit first.
LR_POLICY_NEEDS = {"step": ("gamma", "step_size"), "multistep": ("gamma", "milestones"), "exp": ("gamma",),
                   "inv": ("gamma", "power"), "poly": ("power",), "sigmoid": ("gamma", "step_size")}
MOMENTUM_FREE = ("adam", "adamw", "adagrad", "adadelta")


def lr_policy_problems(policy: LrPolicy) -> list[tuple[tuple[tuple, ...], str]]:
    """A policy's missing parameters (its keys relative to the policy)."""
    missing = [k for k in LR_POLICY_NEEDS.get(policy.type, ()) if getattr(policy, k) is None]
    if not missing:
        return []
    return [((("type",),), f"lr_policy {policy.type} needs {', '.join(missing)}")]


def solver_problems(solver: SolverSpec) -> list[tuple[tuple[tuple, ...], str]]:
    """The solver's settings that do not go together (keys relative to the solver)."""
    found = []
    if solver.type == "nesterov" and not solver.momentum:
        found.append(((("momentum",), ("type",)), "solver nesterov needs momentum > 0"))
    if solver.momentum_convention == "caffe" and solver.type not in ("sgd", "nesterov"):
        found.append(((("momentum_convention",),),
                      f"solver.momentum_convention caffe is for sgd and nesterov, not {solver.type}"))
    if solver.momentum and solver.type in MOMENTUM_FREE:
        found.append(((("momentum",),),
                      f"solver {solver.type} has no momentum (use betas for adam/adamw, rho for adadelta)"))
    found += [(tuple(("lr_policy",) + key for key in keys), message)
              for keys, message in lr_policy_problems(solver.lr_policy)]
    return found
