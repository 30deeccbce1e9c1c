"""Unit checks of the train section's numbers (docs/spec.md section 3): every lr policy against its
formula and against PyTorch's schedulers, Adam's bias corrections, the solver defaults against
PyTorch's optimizer defaults, frozen parameters (lr_mult 0) and shared parameters (share:)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from schemas.train import LrPolicy, SolverSpec, lr_policy_problems  # noqa: E402
from toolkit.errors import UserError  # noqa: E402
from toolkit.frontend import Net  # noqa: E402
from toolkit.optim.solvers import BIAS1, BIAS2, LR, SolverConfig, host_values  # noqa: E402
from toolkit.training.schedule import learning_rate  # noqa: E402
from toolkit.training.trainer import Trainer  # noqa: E402
from toolkit.weights import save_weights  # noqa: E402

BASE = 0.1
MAX_ITER = 40


# -- lr policies ---------------------------------------------------------------------------------
def rates(policy: LrPolicy, n: int = MAX_ITER + 1, base: float = BASE) -> np.ndarray:
    return np.array([learning_rate(base, policy, i, MAX_ITER) for i in range(n)])


def torch_rates(make, n: int = MAX_ITER + 1, base: float = BASE) -> np.ndarray:
    """The lr a torch scheduler gives iteration i when stepped once per iteration."""
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=base)
    sched = make(opt)
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return np.array(out)


S = torch.optim.lr_scheduler
ITERS = np.arange(MAX_ITER + 1)
POLICIES = {
    # id: (policy, the closed form over i = 0..MAX_ITER, a torch scheduler or None)
    "fixed": (LrPolicy(type="fixed"), np.full(ITERS.shape, BASE), None),
    "sigmoid": (LrPolicy(type="sigmoid", gamma=-0.2, step_size=15), BASE / (1 + np.exp(0.2 * (ITERS - 15))), None),
    "step": (LrPolicy(type="step", gamma=0.5, step_size=7), BASE * 0.5 ** (ITERS // 7),
             lambda o: S.StepLR(o, step_size=7, gamma=0.5)),
    "multistep": (LrPolicy(type="multistep", gamma=0.1, milestones=[25, 5, 12]),
                  BASE * 0.1 ** ((ITERS >= 5).astype(int) + (ITERS >= 12) + (ITERS >= 25)),
                  lambda o: S.MultiStepLR(o, milestones=[5, 12, 25], gamma=0.1)),
    "exp": (LrPolicy(type="exp", gamma=0.93), BASE * 0.93 ** ITERS, lambda o: S.ExponentialLR(o, gamma=0.93)),
    # Caffe's inv: base * (1 + gamma i)^-power (no torch scheduler: LambdaLR with the formula)
    "inv": (LrPolicy(type="inv", gamma=0.05, power=0.75), BASE * (1 + 0.05 * ITERS) ** -0.75,
            lambda o: S.LambdaLR(o, lambda k: (1 + 0.05 * k) ** -0.75)),
    "poly": (LrPolicy(type="poly", power=2.0), BASE * (1 - ITERS / MAX_ITER) ** 2,
             lambda o: S.PolynomialLR(o, total_iters=MAX_ITER, power=2.0)),
    "cosine": (LrPolicy(type="cosine"), BASE * (1 + np.cos(np.pi * ITERS / MAX_ITER)) / 2,
               lambda o: S.CosineAnnealingLR(o, T_max=MAX_ITER)),
    "cosine_min_lr": (LrPolicy(type="cosine", min_lr=0.01),
                      0.01 + (BASE - 0.01) * (1 + np.cos(np.pi * ITERS / MAX_ITER)) / 2,
                      lambda o: S.CosineAnnealingLR(o, T_max=MAX_ITER, eta_min=0.01)),
}


@pytest.mark.parametrize("name", list(POLICIES))
def test_policy_formula_and_torch_scheduler(name):
    policy, expected, make = POLICIES[name]
    assert lr_policy_problems(policy) == []
    got = rates(policy)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15)
    if make is not None:
        np.testing.assert_allclose(got, torch_rates(make), rtol=1e-9, atol=1e-12)


def test_policy_hand_values():
    step = LrPolicy(type="step", gamma=0.1, step_size=3)
    assert [learning_rate(0.5, step, k, 100) for k in (0, 2, 3, 5, 6)] == pytest.approx(
        [0.5, 0.5, 0.05, 0.05, 0.005], rel=1e-12)
    multi = LrPolicy(type="multistep", gamma=0.5, milestones=[2, 4])
    assert [learning_rate(1.0, multi, k, 10) for k in range(6)] == pytest.approx([1, 1, .5, .5, .25, .25])
    assert learning_rate(0.01, LrPolicy(type="inv", gamma=1e-4, power=0.75), 1000, 10) == pytest.approx(
        0.01 * 1.1 ** -0.75, rel=1e-12)
    assert learning_rate(0.2, LrPolicy(type="poly", power=1.0), 30, 40) == pytest.approx(0.05, rel=1e-12)
    assert learning_rate(0.2, LrPolicy(type="poly", power=1.0), 40, 40) == 0.0
    cos = LrPolicy(type="cosine", min_lr=0.02)
    assert learning_rate(0.1, cos, 0, 40) == pytest.approx(0.1, rel=1e-12)
    assert learning_rate(0.1, cos, 20, 40) == pytest.approx(0.06, rel=1e-12)
    assert learning_rate(0.1, cos, 40, 40) == pytest.approx(0.02, rel=1e-12)
    assert learning_rate(0.3, LrPolicy(type="exp", gamma=0.5), 3, 40) == pytest.approx(0.0375, rel=1e-12)


@pytest.mark.parametrize("name", ["fixed", "step", "cosine", "poly"])
@pytest.mark.parametrize("factor", [None, 0.25])
def test_warmup_multiplies_a_linear_ramp(name, factor):
    """warmup_iters W: factor rising linearly from warmup_factor (default 0.1) at i=0 to 1 at i=W,
    times the policy's own rate; PyTorch's LinearLR chained with the policy's scheduler."""
    policy, expected, make = POLICIES[name]
    extra = {"warmup_iters": 8} if factor is None else {"warmup_iters": 8, "warmup_factor": factor}
    warm = policy.model_copy(update=extra)
    start = 0.1 if factor is None else factor
    ramp = np.where(ITERS < 8, start + (1 - start) * ITERS / 8, 1.0)
    got = rates(warm)
    np.testing.assert_allclose(got, expected * ramp, rtol=1e-12, atol=1e-15)
    assert got[0] == pytest.approx(start * BASE) and got[8] == pytest.approx(expected[8])
    schedulers = [lambda o: S.LinearLR(o, start_factor=start, end_factor=1.0, total_iters=8)]
    if make is not None and name != "cosine":   # CosineAnnealingLR's recursive form does not chain
        schedulers.append(make)
    if len(schedulers) == 2 or name == "fixed":
        theirs = torch_rates(lambda o: S.ChainedScheduler([m(o) for m in schedulers]))
        np.testing.assert_allclose(got, theirs, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("policy, missing", [
    (LrPolicy(type="step", gamma=0.1), "step_size"),
    (LrPolicy(type="multistep", gamma=0.1), "milestones"),
    (LrPolicy(type="exp"), "gamma"),
    (LrPolicy(type="inv", gamma=0.1), "power"),
    (LrPolicy(type="poly"), "power"),
])
def test_policy_missing_parameter_is_found(policy, missing):
    (keys, message), = lr_policy_problems(policy)
    assert keys == (("type",),) and message.startswith(f"lr_policy {policy.type} needs ") and missing in message


# -- host values ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_adam_bias_corrections(dtype):
    cfg = SolverConfig(type="adam", betas=(0.8, 0.95))
    for step in (1, 2, 10, 1000):
        values = host_values(cfg, 0.003, step, dtype)
        assert set(values) == {LR, BIAS1, BIAS2}
        assert all(v.shape == () and v.dtype == np.dtype(dtype) for v in values.values())
        assert float(values[LR]) == pytest.approx(0.003, rel=1e-7)
        assert float(values[BIAS1]) == pytest.approx(1 / (1 - 0.8 ** step), rel=1e-7)
        assert float(values[BIAS2]) == pytest.approx(1 / math.sqrt(1 - 0.95 ** step), rel=1e-7)
    # t counts from 1: the first step's corrections undo the (1 - beta) of a zero-started moment
    first = host_values(cfg, 1.0, 1, "float64")
    assert float(first[BIAS1]) == pytest.approx(5.0) and float(first[BIAS2]) == pytest.approx(1 / math.sqrt(0.05))
    assert set(host_values(SolverConfig(type="adamw"), 0.1, 3, "float32")) == {LR, BIAS1, BIAS2}


@pytest.mark.parametrize("solver", ["sgd", "nesterov", "rmsprop", "adagrad"])
def test_host_values_of_other_solvers_are_the_rate_only(solver):
    values = host_values(SolverConfig(type=solver, momentum=0.9), 0.25, 5, "float32")
    assert list(values) == [LR] and float(values[LR]) == 0.25 and values[LR].dtype == np.float32


# -- defaults ------------------------------------------------------------------------------------
TORCH_OPT = {"sgd": torch.optim.SGD, "nesterov": torch.optim.SGD, "adam": torch.optim.Adam,
             "adamw": torch.optim.AdamW, "rmsprop": torch.optim.RMSprop, "adagrad": torch.optim.Adagrad}


@pytest.mark.parametrize("solver", list(TORCH_OPT))
def test_solver_defaults_are_torch_defaults(solver):
    cfg = SolverConfig.from_spec(SolverSpec(type=solver))
    defaults = TORCH_OPT[solver]([nn.Parameter(torch.zeros(1))], lr=0.1).defaults
    assert cfg.type == solver
    assert cfg.weight_decay == defaults["weight_decay"] == (0.01 if solver == "adamw" else 0.0)
    assert cfg.momentum == 0.0 and cfg.clip_gradients is None
    if "eps" in defaults:
        assert cfg.eps == defaults["eps"]
    if "betas" in defaults:
        assert cfg.betas == tuple(defaults["betas"]) == (0.9, 0.999)
    if "alpha" in defaults:
        assert cfg.alpha == defaults["alpha"] == 0.99
    expected_eps = {"adam": 1e-8, "adamw": 1e-8, "rmsprop": 1e-8, "adagrad": 1e-10}
    if solver in expected_eps:
        assert cfg.eps == expected_eps[solver]


def test_explicit_solver_values_win_over_defaults():
    cfg = SolverConfig.from_spec(SolverSpec(type="adamw", weight_decay=0.0, eps=1e-6, betas=[0.5, 0.6]))
    assert (cfg.weight_decay, cfg.eps, cfg.betas) == (0.0, 1e-6, (0.5, 0.6))
    cfg = SolverConfig.from_spec(SolverSpec(type="adagrad", eps=1e-3, weight_decay=0.1))
    assert (cfg.eps, cfg.weight_decay) == (1e-3, 0.1)
    cfg = SolverConfig.from_spec(SolverSpec(type="rmsprop", alpha=0.9, momentum=0.0))
    assert cfg.alpha == 0.9


# -- nets for the graph-level checks -------------------------------------------------------------
def L(name, type, bottom, top=None, **params):
    return {"name": name, "type": type, "bottom": bottom, "top": top or name, **params}


def write_net(tmp_path: Path, layers, solver: dict, n=24, features=6, classes=4, seed=5,
              max_iter=5) -> Path:
    rng = np.random.default_rng(seed)
    np.savez(tmp_path / "data.npz", data=rng.normal(size=(n, features)).astype(np.float32),
             label=rng.integers(0, classes, n))
    doc = {"name": "solvers",
           "inputs": {"data": {"shape": ["N", features], "dtype": "float32"},
                      "label": {"shape": ["N"], "dtype": "int64"}},
           "layers": layers,
           "train": {"data": {"source": "data.npz", "test_fraction": 0, "batch_size": 8, "shuffle": True},
                     "solver": solver, "max_iter": max_iter, "seed": seed}}
    path = tmp_path / "net.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def start(tmp_path: Path, path: Path, seed=5) -> tuple[Trainer, dict]:
    """A Trainer from perturbed init weights (biases off zero), saved and passed as --weights."""
    net = Net.load(str(path))
    weights = net.init_weights(seed, "float32")
    rng = np.random.default_rng(seed + 1)
    for k, w in weights.items():
        if k.endswith(".bias"):
            weights[k] = rng.normal(0.0, 0.1, w.shape).astype(np.float32)
    save_weights(str(tmp_path / "init.safetensors"), weights)
    return Trainer(Net.load(str(path)), tmp_path / "run", weights=str(tmp_path / "init.safetensors")), weights


def test_yaml_solver_defaults_reach_the_trainer(tmp_path):
    layers = [L("ip", "InnerProduct", "data", num_output=4), L("loss", "SoftmaxWithLoss", ["ip", "label"])]
    trainer, _ = start(tmp_path, write_net(tmp_path, layers, {"type": "adamw"}))
    assert (trainer.cfg.weight_decay, trainer.cfg.eps, trainer.cfg.betas) == (0.01, 1e-8, (0.9, 0.999))
    trainer, _ = start(tmp_path, write_net(tmp_path, layers, {"type": "adagrad"}))
    assert (trainer.cfg.weight_decay, trainer.cfg.eps) == (0.0, 1e-10)
    with pytest.raises(UserError, match="momentum"):
        start(tmp_path, write_net(tmp_path, layers, {"type": "nesterov"}))


# -- frozen parameters -----------------------------------------------------------------------------
def mlp(frozen: str | None, bias_only=False):
    layers = [L("ip1", "InnerProduct", "data", num_output=8), L("relu1", "ReLU", "ip1", "ip1"),
              L("ip2", "InnerProduct", "ip1", num_output=8), L("relu2", "ReLU", "ip2", "ip2"),
              L("ip3", "InnerProduct", "ip2", num_output=4), L("loss", "SoftmaxWithLoss", ["ip3", "label"])]
    for layer in layers:
        if layer["name"] == frozen:
            layer["lr_mult"] = [1, 0] if bias_only else 0
    return layers


SGD = {"type": "sgd", "base_lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}


def scopes(node) -> list[str]:
    """The layer scopes a node was made from (a fused node joins its members' with '+')."""
    return node.scope.split("+")


def grad_consumers_of_bottom(graph, layer: str) -> int:
    """How many weight-gradient GEMMs of InnerProduct ``layer`` read its bottom (dW = dy^T x: a
    matmul with trans_a, which the fusion passes leave alone). The forward GEMM may have been
    fused with its bias and activation; its first input is the bottom either way."""
    matmul = next(n for n in graph.nodes if layer in scopes(n) and n.op in ("matmul", "fused_epilogue"))
    x = matmul.inputs[0]
    return sum(1 for n in graph.nodes if f"{layer}.grad" in scopes(n) and n.op == "matmul" and n.attrs["trans_a"]
               and any(v.id == x.id for v in n.inputs))


@pytest.mark.parametrize("frozen", ["ip1", "ip2"])
def test_frozen_layer_has_no_update_no_slot_no_gradient(tmp_path, frozen):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    trainer, initial = start(tmp_path / "a", write_net(tmp_path / "a", mlp(frozen), SGD))
    control, _ = start(tmp_path / "b", write_net(tmp_path / "b", mlp(None), SGD))
    graph = trainer.graph
    for p in ("weight", "bias"):
        key = f"{frozen}.{p}"
        assert key not in graph.updates and key in control.graph.updates
        assert f"{key}@momentum" not in trainer.store and f"{key}@momentum" in control.store
    assert not any(n.scope == f"{frozen}.sgd" for n in graph.nodes)
    assert any(n.scope == f"{frozen}.sgd" for n in control.graph.nodes)
    # no weight-gradient work: nothing in the backward pass reads the layer's input
    assert grad_consumers_of_bottom(graph, frozen) == 0
    assert grad_consumers_of_bottom(control.graph, frozen) > 0
    if frozen == "ip1":        # the first layer: no backward pass through it at all
        assert not any({"ip1.grad", "relu1.grad"} & set(scopes(n)) for n in graph.nodes)
    assert len(graph.nodes) < len(control.graph.nodes)
    for k in range(5):
        trainer.step(k)
    for p in ("weight", "bias"):     # unchanged bit for bit: no lr, no weight decay, no momentum
        np.testing.assert_array_equal(trainer.store[f"{frozen}.{p}"], initial[f"{frozen}.{p}"])
    for other in {"ip1", "ip2", "ip3"} - {frozen}:
        assert np.abs(trainer.store[f"{other}.weight"] - initial[f"{other}.weight"]).max() > 1e-3


class TorchMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.ip1, self.ip2, self.ip3 = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        return self.ip3(F.relu(self.ip2(F.relu(self.ip1(x)))))


def torch_trajectory(trainer: Trainer, model: nn.Module, opt, iters: int) -> tuple[list, list]:
    ours, theirs = [], []
    arrays = trainer.train_set.arrays
    for k in range(iters):
        rows = trainer.order.rows(k)
        ours.append(trainer.step(k)["loss"])
        opt.zero_grad()
        loss = F.cross_entropy(model(torch.tensor(arrays["data"][rows])), torch.tensor(arrays["label"][rows]))
        loss.backward()
        opt.step()
        theirs.append(float(loss.detach()))
    return ours, theirs


def load_torch(model: nn.Module, weights: dict) -> nn.Module:
    model.load_state_dict({k: torch.tensor(v) for k, v in weights.items()})
    return model


def assert_state_equal(trainer: Trainer, model: nn.Module) -> None:
    for k, v in model.state_dict().items():
        e = v.numpy()
        np.testing.assert_allclose(trainer.store[k], e, rtol=1e-4, atol=1e-4 * np.abs(e).max(), err_msg=k)


@pytest.mark.parametrize("bias_only", [False, True])
def test_frozen_matches_torch_requires_grad_false(tmp_path, bias_only):
    trainer, initial = start(tmp_path, write_net(tmp_path, mlp("ip2", bias_only), SGD))
    model = load_torch(TorchMLP(), initial)
    frozen = [model.ip2.bias] if bias_only else [model.ip2.weight, model.ip2.bias]
    for p in frozen:
        p.requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1, momentum=0.9,
                          weight_decay=0.01)
    ours, theirs = torch_trajectory(trainer, model, opt, 5)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    assert_state_equal(trainer, model)
    np.testing.assert_array_equal(trainer.store["ip2.bias"], initial["ip2.bias"])
    if bias_only:
        assert "ip2.weight" in trainer.graph.updates and "ip2.bias" not in trainer.graph.updates
        assert np.abs(trainer.store["ip2.weight"] - initial["ip2.weight"]).max() > 1e-3


# -- shared parameters ---------------------------------------------------------------------------
SHARED = [L("ipa", "InnerProduct", "data", num_output=6), L("tanh", "TanH", "ipa", "ipa"),
          L("ipb", "InnerProduct", "ipa", num_output=6, share="ipa"),
          L("out", "InnerProduct", "ipb", num_output=4), L("loss", "SoftmaxWithLoss", ["out", "label"])]


class TorchShared(nn.Module):
    """One Linear used twice (its gradient is the sum of both uses), as share: does."""

    def __init__(self):
        super().__init__()
        self.ipa, self.out = nn.Linear(6, 6), nn.Linear(6, 4)

    def forward(self, x):
        return self.out(self.ipa(torch.tanh(self.ipa(x))))


def test_shared_parameters_sum_gradients(tmp_path):
    """Plain SGD with lr 1: one step moves the shared weight by exactly the summed gradient of
    both uses, which differs from either use's gradient alone."""
    trainer, initial = start(tmp_path, write_net(tmp_path, SHARED, {"type": "sgd", "base_lr": 1.0}, features=6))
    assert sorted(k for k in trainer.store) == ["ipa.bias", "ipa.weight", "out.bias", "out.weight"]
    assert "ipb.weight" not in trainer.graph.weights
    trainer.step(0)
    rows = trainer.order.rows(0)
    x = torch.tensor(trainer.train_set.arrays["data"][rows])
    y = torch.tensor(trainer.train_set.arrays["label"][rows])
    # torch with two independent copies of the same weights gives each use's gradient
    first, second = nn.Linear(6, 6), nn.Linear(6, 6)
    out = nn.Linear(6, 4)
    for lin, key in ((first, "ipa"), (second, "ipa"), (out, "out")):
        lin.weight.data = torch.tensor(initial[f"{key}.weight"])
        lin.bias.data = torch.tensor(initial[f"{key}.bias"])
    F.cross_entropy(out(second(torch.tanh(first(x)))), y).backward()
    for p in ("weight", "bias"):
        g1, g2 = getattr(first, p).grad.numpy(), getattr(second, p).grad.numpy()
        ours = initial[f"ipa.{p}"] - trainer.store[f"ipa.{p}"]         # lr 1: the step is the gradient
        scale = np.abs(g1 + g2).max()
        np.testing.assert_allclose(ours, g1 + g2, rtol=1e-4, atol=1e-5 * scale, err_msg=p)
        assert np.abs(g1).max() > 1e-3 and np.abs(g2).max() > 1e-3
        assert np.abs(ours - g1).max() > 1e-3 * scale and np.abs(ours - g2).max() > 1e-3 * scale


def test_shared_parameters_trajectory_matches_torch(tmp_path):
    solver = {"type": "sgd", "base_lr": 0.2, "momentum": 0.9, "weight_decay": 0.01}
    trainer, initial = start(tmp_path, write_net(tmp_path, SHARED, solver, features=6))
    model = load_torch(TorchShared(), initial)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9, weight_decay=0.01)
    ours, theirs = torch_trajectory(trainer, model, opt, 8)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
    assert_state_equal(trainer, model)
    np.testing.assert_allclose(trainer.store["ipa.weight@momentum"], opt.state[model.ipa.weight]["momentum_buffer"],
                               rtol=1e-4, atol=1e-6)
