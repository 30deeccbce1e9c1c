"""A Caffe solver file as the net's train section: the solver, its rate policy, the schedule.

Caffe's SGD folds the rate into its momentum buffer (v = m v + lr g); the toolkit's default, as
PyTorch's, applies the rate at the update (buf = m buf + g; w -= lr buf). The two are the same
training while the rate is constant and differ after a rate change, where Caffe's past momentum
keeps the old rate for a while: an imported SGD or Nesterov solver with momentum takes
``momentum_convention: caffe``, so the training is Caffe's.
"""
from __future__ import annotations

from .layers import Context
from .prototxt import Message

TYPES = {"SGD": "sgd", "NESTEROV": "nesterov", "ADAM": "adam", "ADAGRAD": "adagrad", "RMSPROP": "rmsprop",
         "ADADELTA": "adadelta"}
POLICIES = {"fixed", "step", "multistep", "exp", "inv", "poly", "sigmoid"}


def import_solver(msg: Message, ctx: Context, notes: list[str]) -> dict:
    """The train section's keys a solver file gives (solver, max_iter, test_interval, display,
    snapshot, seed)."""
    kind = str(msg.value("type", msg.value("solver_type", "SGD"))).upper()
    solver: dict = {}
    if kind not in TYPES:
        where = msg.get("type") or msg.get("solver_type")
        ctx.error(f"the {kind} solver has no counterpart here yet (SGD, Nesterov, Adam, AdaGrad, RMSProp, AdaDelta)",
                  where.loc if where else msg.loc)
    else:
        solver["type"] = TYPES[kind]
    solver["base_lr"] = msg.value("base_lr", 0.01)
    momentum = msg.value("momentum", 0.0)
    if kind == "ADAM":
        solver["betas"] = [momentum or 0.9, msg.value("momentum2", 0.999)]
    elif kind == "ADADELTA":
        solver["rho"] = momentum or 0.95                 # Caffe's AdaDelta decay is its momentum
    elif momentum:
        solver["momentum"] = momentum
        if kind in ("SGD", "NESTEROV"):
            solver["momentum_convention"] = "caffe"
    if msg.value("weight_decay", 0.0):
        solver["weight_decay"] = msg.value("weight_decay")
    if kind in ("ADAM", "ADAGRAD", "RMSPROP", "ADADELTA") and msg.get("delta") is not None:
        solver["eps"] = msg.value("delta")
    if kind == "RMSPROP" and msg.get("rms_decay") is not None:
        solver["alpha"] = msg.value("rms_decay")
    if msg.value("clip_gradients", -1.0) > 0:
        solver["clip_gradients"] = msg.value("clip_gradients")
    regularization = str(msg.value("regularization_type", "L2")).upper()
    if regularization == "L1":
        solver["regularization"] = "l1"
    elif regularization != "L2":
        ctx.error(f"regularization_type {regularization} is not Caffe's (L1, L2)", msg.get("regularization_type").loc)
    iter_size = msg.value("iter_size", 1)
    policy = str(msg.value("lr_policy", "fixed"))
    if policy not in POLICIES:
        ctx.error(f"lr_policy {policy} has no counterpart here yet ({', '.join(sorted(POLICIES))})",
                  msg.get("lr_policy").loc)
    elif policy != "fixed":
        lr = {"type": policy}
        if msg.get("gamma") is not None:
            lr["gamma"] = msg.value("gamma")
        if policy in ("step", "sigmoid"):
            lr["step_size"] = msg.value("stepsize")
        if policy == "multistep":
            lr["milestones"] = msg.values("stepvalue")
        if policy in ("inv", "poly"):
            lr["power"] = msg.value("power")
        solver["lr_policy"] = lr
    train: dict = {"solver": solver}
    for key, ours in (("max_iter", "max_iter"), ("test_interval", "test_interval"), ("display", "display"),
                      ("snapshot", "snapshot")):
        if msg.value(key, 0):
            train[ours] = msg.value(key)
    if msg.value("random_seed", -1) >= 0:
        train["seed"] = msg.value("random_seed")
    if msg.get("test_iter") is not None:
        notes.append("test_iter: a test pass here covers the whole test data")
    if iter_size != 1:
        train["iter_size"] = iter_size
    return train
