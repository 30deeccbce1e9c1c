"""Training trajectories against PyTorch's optimizers (docs/spec.md section 3: solver semantics are
PyTorch's).

Each case writes a small net and an .npz of random data into tmp_path, starts the toolkit's
Trainer and an explicit torch model from the same weights (a perturbed ``init_weights`` saved as
.safetensors), feeds both the same batches (``trainer.order.rows(i)`` of ``trainer.train_set``),
and runs both for a few iterations. Compared: the loss of every iteration (before its update), the
final weights (BatchNorm running statistics included) and the solver slots (momentum buffers,
moments, accumulators) against the torch optimizer's state. Per-layer ``lr_mult`` /
``decay_mult`` map to one torch param group per parameter (lr * lr_mult, weight_decay *
decay_mult).

Tolerances: 1e-4 relative in float32, 1e-9 in float64 (elementwise, with an absolute floor of the
same fraction of the tensor's largest magnitude).

float64: a net cannot declare itself float64 (a float64 input next to float32 weights fails to
lower), and the Trainer has no dtype option, so float64 runs use a test seam: the net's graphs are
lowered with dtype float64 and the trainer's ``net_dtype`` says float64 (data and weights are cast
to it, as the Trainer does for any net dtype).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from numeric_asserts import assert_close as shared_assert_close

import toolkit.training.trainer as trainer_module

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from toolkit.frontend import Net  # noqa: E402
from toolkit.training.trainer import Trainer  # noqa: E402
from toolkit.weights import save_weights  # noqa: E402

TOL = {"float32": 1e-4, "float64": 1e-9}


def assert_close(actual, expected, dtype: str, what: str) -> None:
    shared_assert_close(actual, expected, dtype, what, tol=TOL[dtype], scale_floor=1e-12)
TORCH_DTYPE = {"float32": torch.float32, "float64": torch.float64}
CLASSES = 5

# the toolkit's slot name -> torch optimizer state key, per solver
SLOTS = {
    "sgd": {"momentum": "momentum_buffer"},
    "nesterov": {"momentum": "momentum_buffer"},
    "adam": {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"},
    "adamw": {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"},
    "rmsprop": {"square_avg": "square_avg"},
    "adagrad": {"sum": "sum"},
    "adadelta": {"square_avg": "square_avg", "acc_delta": "acc_delta"},
}


# -- nets -----------------------------------------------------------------------------------------
def L(name, type, bottom, top=None, **params):
    return {"name": name, "type": type, "bottom": bottom, "top": top or name, **params}


# Convolution (no bias: it would sit right before BatchNorm, where its gradient is 0 in exact
# arithmetic and only rounding noise, which Adam-like solvers amplify differently on each side),
# BatchNorm in train mode, ReLU, max Pooling, two InnerProducts (ip1 with lr_mult / decay_mult on
# its bias), SoftmaxWithLoss.
CNN_LAYERS = [
    L("conv1", "Convolution", "data", num_output=6, kernel_size=3, pad=1, bias_term=False),
    L("bn1", "BatchNorm", "conv1"),
    L("relu1", "ReLU", "bn1", "bn1"),
    L("pool1", "Pooling", "bn1", pool="max", kernel_size=2, stride=2),
    L("ip1", "InnerProduct", "pool1", num_output=16, lr_mult=[1, 2], decay_mult=[1, 0]),
    L("relu2", "ReLU", "ip1", "ip1"),
    L("ip2", "InnerProduct", "ip1", num_output=CLASSES, lr_mult=[0.5, 1]),
    L("loss", "SoftmaxWithLoss", ["ip2", "label"], "loss"),
]
CNN_INPUT = (3, 8, 8)
# name -> (lr_mult, decay_mult); others (1, 1). ip2.weight: a scaled rate with weight decay on
CNN_MULTS = {"ip1.bias": (2.0, 0.0), "ip2.weight": (0.5, 1.0)}

MLP_LAYERS = [
    L("ip1", "InnerProduct", "data", num_output=12, lr_mult=[1, 2], decay_mult=[1, 0]),
    L("relu1", "ReLU", "ip1", "ip1"),
    L("ip2", "InnerProduct", "ip1", num_output=CLASSES, lr_mult=[0.5, 1]),
    L("loss", "SoftmaxWithLoss", ["ip2", "label"], "loss"),
]
MLP_INPUT = (10,)
MLP_MULTS = {"ip1.bias": (2.0, 0.0), "ip2.weight": (0.5, 1.0)}


class TorchCNN(nn.Module):
    # attribute names are the toolkit's layer names, so state_dict keys are the weight-file keys
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(6, eps=1e-5, momentum=0.1)
        self.ip1 = nn.Linear(6 * 4 * 4, 16)
        self.ip2 = nn.Linear(16, CLASSES)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2, 2)
        return self.ip2(F.relu(self.ip1(x.flatten(1))))


class TorchMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.ip1 = nn.Linear(10, 12)
        self.ip2 = nn.Linear(12, CLASSES)

    def forward(self, x):
        return self.ip2(F.relu(self.ip1(x)))


# -- setup ----------------------------------------------------------------------------------------
def make_case(tmp_path: Path, layers, in_shape, solver: dict, *, dtype="float32", max_iter=20,
              n=40, batch=16, shuffle=True, seed=3):
    """Writes data, net and perturbed initial weights; returns (trainer, initial weights)."""
    rng = np.random.default_rng(seed)
    data = rng.normal(0.0, 1.0, (n,) + in_shape).astype(np.float32)
    label = rng.integers(0, CLASSES, n).astype(np.int64)
    np.savez(tmp_path / "data.npz", data=data, label=label)
    doc = {
        "name": "traj",
        "inputs": {"data": {"shape": ["N", *in_shape], "dtype": "float32"},
                   "label": {"shape": ["N"], "dtype": "int64"}},
        "layers": layers,
        "train": {"data": {"source": str(tmp_path / "data.npz"), "test_fraction": 0,
                           "batch_size": batch, "shuffle": shuffle},
                  "solver": solver, "max_iter": max_iter, "seed": seed},
    }
    path = tmp_path / "net.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    net = Net.load(str(path))
    weights = net.init_weights(seed, "float32")
    for key, w in weights.items():          # move every bias and BatchNorm array off 0 and 1
        if key.endswith(".bias") or key.endswith(".running_mean"):
            weights[key] = (w + rng.normal(0.0, 0.1, w.shape)).astype(np.float32)
        elif key.startswith("bn") and key.endswith(".weight"):
            weights[key] = (w + rng.normal(0.0, 0.2, w.shape)).astype(np.float32)
        elif key.endswith(".running_var"):
            weights[key] = (w + rng.uniform(0.0, 0.5, w.shape)).astype(np.float32)
    save_weights(str(tmp_path / "init.safetensors"), weights)
    net = Net.load(str(path))
    if dtype != "float32":
        net.graph = lambda phase, _dtype=None, outputs=None: Net.graph(net, phase, dtype, outputs)
    original = trainer_module.net_dtype
    trainer_module.net_dtype = lambda _net: dtype
    try:
        trainer = Trainer(net, tmp_path / "run", weights=str(tmp_path / "init.safetensors"))
    finally:
        trainer_module.net_dtype = original
    assert trainer.dtype == dtype and trainer.graph.inputs["data"].dtype == dtype
    return trainer, weights


def torch_model(cls, weights: dict, dtype: str):
    model = cls().to(TORCH_DTYPE[dtype])
    state = {k: torch.tensor(v, dtype=TORCH_DTYPE[dtype]) for k, v in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing), (missing, unexpected)
    model.train()
    return model


def param_groups(model, base_lr: float, wd: float, mults: dict) -> tuple[list[dict], list[str]]:
    """One group per parameter: lr = base_lr * lr_mult, weight_decay = wd * decay_mult."""
    groups, names = [], []
    for name, p in model.named_parameters():
        lr_mult, decay_mult = mults.get(name, (1.0, 1.0))
        groups.append({"params": [p], "lr": base_lr * lr_mult, "weight_decay": wd * decay_mult})
        names.append(name)
    return groups, names


def run_both(trainer: Trainer, model, opt, iters: int, *, mults: dict, base_lr: float,
             lr_of=None, scheduler=None, clip=None):
    """Runs iterations 0..iters-1 on both sides; returns (our losses, torch losses, torch lrs,
    torch gradient norms before clipping)."""
    ours, theirs, lrs, norms = [], [], [], []
    tdtype = next(model.parameters()).dtype
    names = [n for n, _ in model.named_parameters()]
    arrays = trainer.train_set.arrays
    for i in range(iters):
        rows = trainer.order.rows(i)
        if lr_of is not None:
            for group, name in zip(opt.param_groups, names):
                group["lr"] = lr_of(i) * mults.get(name, (1.0, 1.0))[0]
        lrs.append(opt.param_groups[0]["lr"])
        ours.append(trainer.step(i)["loss"])
        x = torch.tensor(arrays["data"][rows], dtype=tdtype)
        y = torch.tensor(arrays["label"][rows])
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if clip is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        opt.step()
        if scheduler is not None:
            scheduler.step()
        theirs.append(float(loss.detach()))
    return np.array(ours), np.array(theirs), lrs, norms


def compare_state(trainer: Trainer, model, opt, initial: dict, dtype: str, solver: str) -> None:
    """Final weights, BatchNorm statistics and solver slots equal torch's; and they did move."""
    state = model.state_dict()
    compared = 0
    for key, theirs in state.items():
        if key.endswith("num_batches_tracked"):
            continue
        ours = trainer.store[key]
        assert ours.dtype == np.dtype(dtype), f"{key}: stored as {ours.dtype}"
        expected = theirs.detach().numpy()
        assert_close(ours, expected, dtype, key)
        # training changed it by far more than the tolerance: the comparison is not vacuous
        moved = np.abs(expected - initial[key].astype(np.float64)).max()
        assert moved > 100 * TOL[dtype] * max(np.abs(expected).max(), 1e-3), f"{key} hardly moved ({moved})"
        compared += 1
    assert compared == len(initial)
    slots = dict(SLOTS[solver]) if trainer.cfg.momentum or solver not in ("sgd", "nesterov") else {}
    if solver == "rmsprop" and trainer.cfg.momentum:
        slots["momentum"] = "momentum_buffer"
    assert sorted(k for k in trainer.store if "@" in k) == sorted(
        f"{name}@{slot}" for name, _ in model.named_parameters() for slot in slots)
    for name, p in model.named_parameters():
        for slot, torch_key in slots.items():
            key = f"{name}@{slot}"
            assert key in trainer.store, f"no solver slot {key}"
            assert_close(trainer.store[key], opt.state[p][torch_key].numpy(), dtype, key)


def check_losses(ours, theirs, dtype: str) -> None:
    assert np.all(np.isfinite(theirs))
    np.testing.assert_allclose(ours, theirs, rtol=TOL[dtype], atol=0, err_msg="loss trajectory")
    assert np.ptp(theirs) > 100 * TOL[dtype] * np.abs(theirs).max(), "the loss did not change"


# -- the CNN: Convolution, BatchNorm, ReLU, Pooling, InnerProduct, SoftmaxWithLoss ---------------
CNN_CASES = {
    # solver type -> (yaml solver section minus type, torch optimizer factory(groups, base_lr))
    "sgd": ({"base_lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4},
            lambda g, lr: torch.optim.SGD(g, lr=lr, momentum=0.9)),
    "adam": ({"base_lr": 0.01, "weight_decay": 5e-4},
             lambda g, lr: torch.optim.Adam(g, lr=lr, betas=(0.9, 0.999), eps=1e-8)),
    # weight_decay left out: adamw's default is 0.01, as torch's
    "adamw": ({"base_lr": 0.01},
              lambda g, lr: torch.optim.AdamW(g, lr=lr)),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("solver", list(CNN_CASES))
def test_cnn_trajectory_matches_torch(tmp_path, solver, dtype):
    section, make_opt = CNN_CASES[solver]
    trainer, initial = make_case(tmp_path, CNN_LAYERS, CNN_INPUT, {"type": solver, **section}, dtype=dtype)
    base_lr = section["base_lr"]
    wd = section.get("weight_decay", 0.01 if solver == "adamw" else 0.0)
    assert trainer.cfg.weight_decay == wd
    model = torch_model(TorchCNN, initial, dtype)
    groups, _ = param_groups(model, base_lr, wd, CNN_MULTS)
    opt = make_opt(groups, base_lr)
    ours, theirs, _, _ = run_both(trainer, model, opt, 20, mults=CNN_MULTS, base_lr=base_lr)
    check_losses(ours, theirs, dtype)
    compare_state(trainer, model, opt, initial, dtype, solver)


def test_cnn_warmup_step_policy_matches_torch_schedulers(tmp_path):
    """step policy with linear warmup == torch's LinearLR chained with StepLR, stepped per iteration."""
    policy = {"type": "step", "gamma": 0.5, "step_size": 6, "warmup_iters": 5, "warmup_factor": 0.2}
    section = {"type": "sgd", "base_lr": 0.08, "momentum": 0.9, "weight_decay": 5e-4, "lr_policy": policy}
    trainer, initial = make_case(tmp_path, CNN_LAYERS, CNN_INPUT, section)
    model = torch_model(TorchCNN, initial, "float32")
    groups, _ = param_groups(model, 0.08, 5e-4, CNN_MULTS)
    opt = torch.optim.SGD(groups, lr=0.08, momentum=0.9)
    sched = torch.optim.lr_scheduler.ChainedScheduler([
        torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.2, end_factor=1.0, total_iters=5),
        torch.optim.lr_scheduler.StepLR(opt, step_size=6, gamma=0.5),
    ])
    ours, theirs, lrs, _ = run_both(trainer, model, opt, 20, mults=CNN_MULTS, base_lr=0.08, scheduler=sched)
    # the rate each iteration used: the toolkit's policy == torch's schedulers
    np.testing.assert_allclose([trainer.lr_at(i) for i in range(20)], lrs, rtol=1e-12)
    assert lrs[0] == pytest.approx(0.08 * 0.2) and lrs[5] == pytest.approx(0.08)
    assert lrs[6] == pytest.approx(0.04) and lrs[19] == pytest.approx(0.08 * 0.5 ** 3)
    check_losses(ours, theirs, "float32")
    compare_state(trainer, model, opt, initial, "float32", "sgd")


def test_cnn_cosine_warmup_policy_matches_direct_formula(tmp_path):
    """cosine with warmup: torch's param_group['lr'] set each iteration from the closed form."""
    policy = {"type": "cosine", "min_lr": 0.001, "warmup_iters": 4}
    section = {"type": "adam", "base_lr": 0.02, "lr_policy": policy}
    trainer, initial = make_case(tmp_path, CNN_LAYERS, CNN_INPUT, section, max_iter=16)

    def rate(i):
        r = 0.001 + (0.02 - 0.001) * (1 + np.cos(np.pi * i / 16)) / 2
        return r * (0.1 + 0.9 * i / 4 if i < 4 else 1.0)

    model = torch_model(TorchCNN, initial, "float32")
    groups, _ = param_groups(model, 0.02, 0.0, CNN_MULTS)
    opt = torch.optim.Adam(groups, lr=0.02)
    ours, theirs, lrs, _ = run_both(trainer, model, opt, 16, mults=CNN_MULTS, base_lr=0.02, lr_of=rate)
    np.testing.assert_allclose([trainer.lr_at(i) for i in range(16)], lrs, rtol=1e-12)
    check_losses(ours, theirs, "float32")
    compare_state(trainer, model, opt, initial, "float32", "adam")


# -- the other solvers and clipping on a small MLP -----------------------------------------------
MLP_CASES = {
    "nesterov": ({"type": "nesterov", "base_lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3},
                 lambda g, lr: torch.optim.SGD(g, lr=lr, momentum=0.9, nesterov=True)),
    "rmsprop": ({"type": "rmsprop", "base_lr": 0.005, "weight_decay": 1e-3},
                lambda g, lr: torch.optim.RMSprop(g, lr=lr, alpha=0.99, eps=1e-8)),
    "rmsprop_alpha": ({"type": "rmsprop", "base_lr": 0.005, "alpha": 0.9, "eps": 1e-6},
                      lambda g, lr: torch.optim.RMSprop(g, lr=lr, alpha=0.9, eps=1e-6)),
    "rmsprop_momentum": ({"type": "rmsprop", "base_lr": 0.002, "momentum": 0.8, "weight_decay": 1e-3},
                         lambda g, lr: torch.optim.RMSprop(g, lr=lr, momentum=0.8)),
    "adagrad": ({"type": "adagrad", "base_lr": 0.05, "weight_decay": 1e-3},
                lambda g, lr: torch.optim.Adagrad(g, lr=lr, eps=1e-10)),
    "adam_betas": ({"type": "adam", "base_lr": 0.01, "betas": [0.8, 0.99], "eps": 1e-6},
                   lambda g, lr: torch.optim.Adam(g, lr=lr, betas=(0.8, 0.99), eps=1e-6)),
    "sgd_plain": ({"type": "sgd", "base_lr": 0.1},
                  lambda g, lr: torch.optim.SGD(g, lr=lr)),
    "adadelta": ({"type": "adadelta", "base_lr": 1.0, "rho": 0.95, "weight_decay": 1e-3},
                 lambda g, lr: torch.optim.Adadelta(g, lr=lr, rho=0.95, eps=1e-6)),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", list(MLP_CASES))
def test_mlp_solver_matches_torch(tmp_path, case, dtype):
    section, make_opt = MLP_CASES[case]
    trainer, initial = make_case(tmp_path, MLP_LAYERS, MLP_INPUT, section, dtype=dtype, max_iter=12,
                                 n=24, batch=8)
    model = torch_model(TorchMLP, initial, dtype)
    groups, _ = param_groups(model, section["base_lr"], section.get("weight_decay", 0.0), MLP_MULTS)
    opt = make_opt(groups, section["base_lr"])
    ours, theirs, _, _ = run_both(trainer, model, opt, 12, mults=MLP_MULTS, base_lr=section["base_lr"])
    check_losses(ours, theirs, dtype)
    compare_state(trainer, model, opt, initial, dtype, section["type"])


@pytest.mark.parametrize("solver", ["sgd", "adam"])
def test_gradient_clipping_matches_clip_grad_norm(tmp_path, solver):
    """clip_gradients == torch.nn.utils.clip_grad_norm_ over all parameters, before weight decay:
    steps with a larger total norm are scaled down to it, the others are left alone."""
    clip = 0.9
    section = {"type": solver, "base_lr": 0.2 if solver == "sgd" else 0.02, "weight_decay": 1e-2,
               "clip_gradients": clip}
    if solver == "sgd":
        section["momentum"] = 0.9
    trainer, initial = make_case(tmp_path, MLP_LAYERS, MLP_INPUT, section, max_iter=12, n=24, batch=8)
    model = torch_model(TorchMLP, initial, "float32")
    groups, _ = param_groups(model, section["base_lr"], 1e-2, MLP_MULTS)
    opt = (torch.optim.SGD(groups, lr=0.2, momentum=0.9) if solver == "sgd"
           else torch.optim.Adam(groups, lr=0.02))
    ours, theirs, _, norms = run_both(trainer, model, opt, 12, mults=MLP_MULTS, base_lr=section["base_lr"],
                                      clip=clip)
    # both regimes occur: some steps clipped (norm well above), some not (well below)
    assert sum(n > 1.05 * clip for n in norms) >= 2 and sum(n < 0.95 * clip for n in norms) >= 2, norms
    check_losses(ours, theirs, "float32")
    compare_state(trainer, model, opt, initial, "float32", solver)


def test_clipping_changes_the_trajectory(tmp_path):
    """Control for the clipping test: without clip_gradients the same run ends elsewhere."""
    results = []
    for clip in (None, 0.3):
        d = tmp_path / str(clip)
        d.mkdir()
        section = {"type": "sgd", "base_lr": 0.2, "momentum": 0.9, "clip_gradients": clip}
        trainer, _ = make_case(d, MLP_LAYERS, MLP_INPUT, section, max_iter=6, n=24, batch=8)
        for i in range(6):
            trainer.step(i)
        results.append(trainer.store["ip1.weight"].copy())
    assert np.abs(results[0] - results[1]).max() > 1e-2


def test_unshuffled_order_and_short_last_batch(tmp_path):
    """shuffle false reads rows in order, epochs of ceil(n / batch) with a short last batch; the
    trajectory over two epochs still matches torch (a second plan serves the short batch)."""
    trainer, initial = make_case(tmp_path, CNN_LAYERS, CNN_INPUT,
                                 {"type": "sgd", "base_lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4},
                                 shuffle=False, n=20, batch=8, max_iter=6)
    assert [list(trainer.order.rows(i)) for i in (0, 2, 3)] == [list(range(8)), list(range(16, 20)),
                                                                 list(range(8))]
    model = torch_model(TorchCNN, initial, "float32")
    groups, _ = param_groups(model, 0.05, 5e-4, CNN_MULTS)
    opt = torch.optim.SGD(groups, lr=0.05, momentum=0.9)
    ours, theirs, _, _ = run_both(trainer, model, opt, 6, mults=CNN_MULTS, base_lr=0.05)
    check_losses(ours, theirs, "float32")
    compare_state(trainer, model, opt, initial, "float32", "sgd")


def test_run_loop_matches_stepping(tmp_path):
    """Trainer.run() follows the same trajectory as driving step(i): model.safetensors written by
    the loop equals the weights of a torch run of max_iter iterations."""
    section = {"type": "sgd", "base_lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4,
               "lr_policy": {"type": "multistep", "gamma": 0.3, "milestones": [3, 7]}}
    trainer, initial = make_case(tmp_path, CNN_LAYERS, CNN_INPUT, section, max_iter=10)
    trainer.stream = open("/dev/null", "w")
    try:
        assert trainer.run() == 0
    finally:
        trainer.stream.close()
    from toolkit.weights import load_weights
    saved = load_weights(str(tmp_path / "run" / "model.safetensors"))
    model = torch_model(TorchCNN, initial, "float32")
    groups, _ = param_groups(model, 0.05, 5e-4, CNN_MULTS)
    opt = torch.optim.SGD(groups, lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[3, 7], gamma=0.3)
    arrays = trainer.train_set.arrays          # the data order depends on (seed, i) alone
    for i in range(10):
        rows = trainer.order.rows(i)
        opt.zero_grad()
        F.cross_entropy(model(torch.tensor(arrays["data"][rows])), torch.tensor(arrays["label"][rows])).backward()
        opt.step()
        sched.step()
    for key, theirs in model.state_dict().items():
        if not key.endswith("num_batches_tracked"):
            assert_close(saved[key], theirs.numpy(), "float32", key)
    assert not any("@" in k for k in saved), "solver slots leaked into the model file"


class _SGDWithL1:
    """torch's SGD with Caffe's L1 regularization: each group's weight_decay times sign(p) added
    to the gradient before the step (torch has L2 decay only)."""

    def __init__(self, groups, lr):
        self.decay = [g["weight_decay"] for g in groups]
        for g in groups:
            g["weight_decay"] = 0.0
        self.opt = torch.optim.SGD(groups, lr=lr, momentum=0.9)
        self.param_groups, self.state = self.opt.param_groups, self.opt.state

    def zero_grad(self, set_to_none=True):
        self.opt.zero_grad(set_to_none=set_to_none)

    def step(self):
        with torch.no_grad():
            for group, wd in zip(self.opt.param_groups, self.decay):
                for p in group["params"]:
                    p.grad.add_(torch.sign(p), alpha=wd)
        self.opt.step()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_l1_regularization_matches_sgd_with_sign_decay(tmp_path, dtype):
    section = {"type": "sgd", "base_lr": 0.05, "momentum": 0.9, "weight_decay": 0.01, "regularization": "l1"}
    trainer, initial = make_case(tmp_path, MLP_LAYERS, MLP_INPUT, section, dtype=dtype, max_iter=12, n=24, batch=8)
    model = torch_model(TorchMLP, initial, dtype)
    groups, _ = param_groups(model, section["base_lr"], section["weight_decay"], MLP_MULTS)
    opt = _SGDWithL1(groups, section["base_lr"])
    ours, theirs, _, _ = run_both(trainer, model, opt, 12, mults=MLP_MULTS, base_lr=section["base_lr"])
    check_losses(ours, theirs, dtype)
    compare_state(trainer, model, opt, initial, dtype, "sgd")


class _CaffeSGD(torch.optim.Optimizer):
    """Caffe's SGDSolver / NesterovSolver update written out (sgd_solver.cpp): the history takes
    the rate, h' = m*h + lr*(g + wd*w); SGD w -= h'; Nesterov w -= (1+m)*h' - m*h."""

    def __init__(self, groups, lr, momentum, nesterov):
        super().__init__(groups, {"lr": lr, "weight_decay": 0.0})
        self.m, self.nesterov = momentum, nesterov

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                g = p.grad + group["weight_decay"] * p
                h = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                new_h = self.m * h + group["lr"] * g
                p -= (1 + self.m) * new_h - self.m * h if self.nesterov else new_h
                self.state[p]["momentum_buffer"] = new_h


@pytest.mark.parametrize("kind", ["sgd", "nesterov"])
def test_caffes_momentum_convention_through_rate_changes(tmp_path, kind):
    """momentum_convention: caffe trains as Caffe's solvers through a step policy's rate changes;
    PyTorch's convention, from the same start, does not (the two differ once the rate changes)."""
    policy = {"type": "step", "gamma": 0.1, "step_size": 4}
    section = {"type": kind, "base_lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4, "lr_policy": policy,
               "momentum_convention": "caffe"}
    trainer, initial = make_case(tmp_path, MLP_LAYERS, MLP_INPUT, section, dtype="float64", max_iter=12, n=24,
                                 batch=8)
    model = torch_model(TorchMLP, initial, "float64")
    groups, _ = param_groups(model, 0.1, 5e-4, MLP_MULTS)
    opt = _CaffeSGD(groups, 0.1, 0.9, kind == "nesterov")
    ours, theirs, _, _ = run_both(trainer, model, opt, 12, mults=MLP_MULTS, base_lr=0.1,
                                  lr_of=lambda i: 0.1 * 0.1 ** (i // 4))
    check_losses(ours, theirs, "float64")
    compare_state(trainer, model, opt, initial, "float64", "sgd")

    (tmp_path / "pt").mkdir()
    pytorch_way, _ = make_case(tmp_path / "pt", MLP_LAYERS, MLP_INPUT, {**section, "momentum_convention": "pytorch"},
                               dtype="float64", max_iter=12, n=24, batch=8)
    other = np.array([pytorch_way.step(i)["loss"] for i in range(12)])
    np.testing.assert_allclose(other[:5], ours[:5], rtol=1e-9)       # the same while the rate holds
    assert np.abs(other[6:] - ours[6:]).max() > 1e-4                 # not after it falls


def test_caffes_momentum_convention_is_for_sgd_only(tmp_path):
    with pytest.raises(Exception, match="momentum_convention caffe is for sgd and nesterov, not adam"):
        make_case(tmp_path, MLP_LAYERS, MLP_INPUT, {"type": "adam", "momentum_convention": "caffe"})
