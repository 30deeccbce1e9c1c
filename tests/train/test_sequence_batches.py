"""Training on sequences of different lengths (train.data.lengths / padding_value), each batch cut
to its bucket along T, against PyTorch's packed sequences on the same data and batches: the loss of
every step and the final weights, for a classifier on each direction's final state and a tagger
whose loss counts real positions only."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence  # noqa: E402

from toolkit.frontend import Net  # noqa: E402
from toolkit.ir.binding import lengths_input  # noqa: E402
from toolkit.training.trainer import Trainer  # noqa: E402
from toolkit.weights import save_weights  # noqa: E402

ROWS, LONGEST, FEATURES, BATCH, STEPS = 24, 9, 3, 6, 6

CLASSIFIER = """name: cls
inputs:
  data: {{shape: [N, T, 3]}}
  label: {{shape: [N], dtype: int64}}
layers:
  - {{name: rec, type: GRU, bottom: data, top: h, num_output: 5, num_layers: 2, bidirectional: true,
     return_sequence: false}}
  - {{name: fc, type: InnerProduct, bottom: h, top: fc, num_output: 3}}
  - {{name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}}
train:
  data: {{source: seqs.npz, {data}, batch_size: 6, shuffle: false, test_fraction: 0.0}}
  solver: {{type: sgd, base_lr: 0.2}}
  max_iter: 6
{buckets}"""

TAGGER = """name: tag
inputs:
  data: {{shape: [N, T, 3]}}
  tags: {{shape: [N, T], dtype: int64}}
layers:
  - {{name: rec, type: LSTM, bottom: data, top: seq, num_output: 4, bidirectional: true}}
  - {{name: fc, type: InnerProduct, bottom: seq, top: fc, num_output: 3, axis: 2}}
  - {{name: loss, type: SoftmaxWithLoss, bottom: [fc, tags], top: loss, axis: 2}}
train:
  data: {{source: seqs.npz, {data}, batch_size: 6, shuffle: false, test_fraction: 0.0}}
  solver: {{type: sgd, base_lr: 0.2}}
  max_iter: 6
{buckets}"""


def write_data(folder, pad_value=0.0):
    rng = np.random.default_rng(0)
    # each batch of 6 its own longest example: 9, 3, 6, 2 (buckets 16, 4, 8, 4)
    caps = np.repeat([LONGEST, 3, 6, 2], BATCH)
    lengths = np.array([rng.integers(1, c + 1) for c in caps])
    lengths[::BATCH] = caps[::BATCH]
    data = np.full((ROWS, LONGEST, FEATURES), pad_value, np.float32)
    for i, n in enumerate(lengths):
        data[i, :n] = rng.normal(size=(n, FEATURES))
    tags = rng.integers(0, 3, (ROWS, LONGEST))
    np.savez(folder / "seqs.npz", data=data, label=rng.integers(0, 3, ROWS), tags=tags, lengths=lengths)
    return data, lengths


class TorchClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.rec = nn.GRU(3, 5, num_layers=2, bidirectional=True, batch_first=True)
        self.fc = nn.Linear(10, 3)

    def forward(self, x, lengths):
        _, h_n = self.rec(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
        return nn.functional.cross_entropy(self.fc(torch.cat([h_n[-2], h_n[-1]], dim=1)), self.target)


class TorchTagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.rec = nn.LSTM(3, 4, bidirectional=True, batch_first=True)
        self.fc = nn.Linear(8, 3)

    def forward(self, x, lengths):
        packed, _ = self.rec(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
        out, _ = pad_packed_sequence(packed, batch_first=True, total_length=x.shape[1])
        real = torch.arange(x.shape[1])[None, :] < lengths[:, None]
        return nn.functional.cross_entropy(self.fc(out)[real], self.target[:, :x.shape[1]][real])


@pytest.mark.parametrize("kind", ["classifier", "tagger"])
@pytest.mark.parametrize("source", ["lengths", "padding_value", "lengths+buckets", "back to back"])
def test_sequence_batches_train_as_pytorch_packed_sequences(tmp_path, kind, source):
    pad = -7.0 if source == "padding_value" else 0.0
    data, lengths = write_data(tmp_path, pad)
    if source == "back to back":                # each example's steps one after another: no padding stored
        arrays = dict(np.load(tmp_path / "seqs.npz"))
        arrays["data"] = np.concatenate([data[i, :n] for i, n in enumerate(lengths)])
        arrays["tags"] = np.concatenate([arrays["tags"][i, :n] for i, n in enumerate(lengths)])
        np.savez(tmp_path / "seqs.npz", **arrays)
    spec = "padding_value: -7.0" if source == "padding_value" else "lengths: lengths"
    buckets = "buckets: {T: [4, 8, 16]}\n" if "buckets" in source else ""
    text = (CLASSIFIER if kind == "classifier" else TAGGER).format(data=spec, buckets=buckets)
    (tmp_path / "net.yaml").write_text(text)
    net = Net.load(str(tmp_path / "net.yaml"))
    weights = net.init_weights(seed=1)
    save_weights(str(tmp_path / "w.safetensors"), weights)
    trainer = Trainer(net, tmp_path / "run", weights=str(tmp_path / "w.safetensors"), stream=open("/dev/null", "w"))

    model = TorchClassifier() if kind == "classifier" else TorchTagger()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    labels = np.load(tmp_path / "seqs.npz")["label" if kind == "classifier" else "tags"]
    if labels.ndim == 1 and kind == "tagger":   # back to back: padded again for PyTorch
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        labels = np.stack([np.pad(labels[a: a + n], (0, LONGEST - n)) for a, n in zip(starts, lengths)])
    seen = set()
    for i in range(STEPS):
        rows = trainer.order.rows(i)
        batch = trainer.train_set.take(rows)
        longest = int(lengths[rows].max())
        # the batch comes cut to its bucket (or its longest example), with each row's length
        want_t = next((g for g in (4, 8, 16) if g >= longest), longest) if buckets else longest
        assert batch["data"].shape[1] == want_t and list(batch[lengths_input("T")]) == list(lengths[rows])
        seen.add(want_t)
        ours = trainer.step(i)["loss"]
        model.target = torch.from_numpy(labels[rows])
        x = torch.from_numpy(np.where(np.arange(LONGEST)[None, :, None] < lengths[rows][:, None, None],
                                      data[rows], 0.0)[:, :longest].astype(np.float32))
        optimizer.zero_grad()
        theirs = model(x, torch.from_numpy(lengths[rows]))
        theirs.backward()
        optimizer.step()
        np.testing.assert_allclose(ours, theirs.item(), rtol=2e-5, err_msg=f"step {i}")
    assert len(seen) > 1                        # batches of different lengths ran
    final = trainer.model_weights()
    for name, param in model.state_dict().items():
        np.testing.assert_allclose(np.asarray(final[name]), param.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


def test_lengths_that_do_not_fit_are_one_error(tmp_path):
    from toolkit.errors import UserError
    write_data(tmp_path)
    np.savez(tmp_path / "seqs.npz", **{**dict(np.load(tmp_path / "seqs.npz")), "lengths": np.full(ROWS, 10)})
    (tmp_path / "net.yaml").write_text(CLASSIFIER.format(data="lengths: lengths", buckets=""))
    with pytest.raises(UserError, match="example 0 has length 10; lengths must be from 1 to the arrays' T=9"):
        Trainer(Net.load(str(tmp_path / "net.yaml")), tmp_path / "run", stream=open("/dev/null", "w"))
    (tmp_path / "net.yaml").write_text(CLASSIFIER.format(data="lengths: size", buckets=""))
    with pytest.raises(UserError, match="no array 'size' of lengths"):
        Trainer(Net.load(str(tmp_path / "net.yaml")), tmp_path / "run", stream=open("/dev/null", "w"))


@pytest.mark.parametrize("buckets", ["", "buckets: {T: [4, 8, 16]}"])
def test_toolkit_test_measures_what_the_runs_test_pass_did(tmp_path, buckets):
    """The test split of sequences of different lengths, measured by `toolkit test` (and the
    public evaluate) on a run's weights, is the run's last test pass to the digit: both feed the
    padded batches with their lengths to a graph that keeps the padding out. (Before, `toolkit
    test` lowered the test phase without the lengths and ran the recurrence over the padding.)"""
    import json

    from tests.train.train_helpers import cli, records
    write_data(tmp_path)
    net = tmp_path / "net.yaml"
    net.write_text(CLASSIFIER.format(data="lengths: lengths", buckets=buckets).replace("test_fraction: 0.0",
                                                                                   "test_fraction: 0.5"))
    run = tmp_path / "run"
    assert cli("train", net, "--out", run).status == 0
    logged = records(run)[-1]["test_loss"]
    r = cli("test", net, "--weights", run / "model.safetensors")
    assert r.status == 0, r.err
    measured = json.loads(r.out)
    assert measured["examples"] == ROWS // 2 and measured["loss"] == pytest.approx(logged, rel=1e-6, abs=1e-6)
    from toolkit.training.evaluate import evaluate
    result = evaluate(Net.load(str(net)), str(run / "model.safetensors"))
    assert result.examples == ROWS // 2 and result.metrics["loss"] == pytest.approx(logged, rel=1e-6)
