"""Learning-rate policies: the rate of iteration i (counted from 0), with optional linear warmup.

fixed: base · step: base·gamma^floor(i/step_size) · multistep: base·gamma^(milestones passed) ·
exp: base·gamma^i · inv: base·(1+gamma·i)^-power · poly: base·(1-i/max_iter)^power ·
cosine: min_lr + (base-min_lr)·(1+cos(pi·i/max_iter))/2 · sigmoid (Caffe's):
base/(1+exp(-gamma·(i-step_size))). Warmup multiplies by a factor rising
linearly from warmup_factor at i=0 to 1 at i=warmup_iters (PyTorch's LinearLR). The parameters a
policy needs are checked when the net file is read (schemas/train.py, lr_policy_problems).
"""
from __future__ import annotations

import bisect
import math


def learning_rate(base_lr: float, policy, i: int, max_iter: int) -> float:
    kind = policy.type
    if kind == "fixed":
        rate = base_lr
    elif kind == "step":
        rate = base_lr * policy.gamma ** (i // policy.step_size)
    elif kind == "multistep":
        rate = base_lr * policy.gamma ** bisect.bisect_right(sorted(policy.milestones), i)
    elif kind == "exp":
        rate = base_lr * policy.gamma ** i
    elif kind == "inv":
        rate = base_lr * (1 + policy.gamma * i) ** (-policy.power)
    elif kind == "poly":
        rate = base_lr * max(0.0, 1 - i / max_iter) ** policy.power
    elif kind == "sigmoid":
        rate = base_lr / (1 + math.exp(-policy.gamma * (i - policy.step_size)))
    elif kind == "cosine":
        rate = policy.min_lr + (base_lr - policy.min_lr) * (1 + math.cos(math.pi * i / max_iter)) / 2
    else:
        raise ValueError(f"unknown lr policy {kind}")
    if policy.warmup_iters and i < policy.warmup_iters:
        factor = policy.warmup_factor + (1 - policy.warmup_factor) * i / policy.warmup_iters
        rate *= factor
    return rate
