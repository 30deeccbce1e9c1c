"""Fine-tuning in one step (docs/spec.md sections 1 and 4): `toolkit train NET --weights W
--new-head K` on a deploy net (no label, no loss, a Softmax at the end, as an imported Caffe
model), the same written as a derived net that deletes the classifier and writes it anew, and the
message for a bottom produced later in a merged net's order."""
from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.train.train_helpers import cli
from toolkit.errors import SpecError
from toolkit.frontend.heads import with_new_head
from toolkit.weights import save_weights
from toolkit.zoo.resolve import load_net

# a deploy net as `toolkit import caffe` writes one: no label, no loss, class probabilities out.
# The feature layer is frozen (lr_mult 0), so that after training it still holds exactly what
# the weights file gave it
DEPLOY = """\
name: pretrained
inputs:
  data: {shape: [N, 16], dtype: float32}
layers:
  - {name: ip1, type: InnerProduct, bottom: data, top: ip1, num_output: 24, lr_mult: [0, 0]}
  - {name: relu1, type: ReLU, bottom: ip1, top: ip1}
  - {name: fc8, type: InnerProduct, bottom: ip1, top: fc8, num_output: 10}
  - {name: prob, type: Softmax, bottom: fc8, top: prob}
"""


def _pretrained(folder: Path) -> dict[str, np.ndarray]:
    """The deploy net, its weights (a 10-class head and a feature layer), and a 3-class data set."""
    (folder / "deploy.yaml").write_text(DEPLOY)
    rng = np.random.default_rng(3)
    weights = {"ip1.weight": (rng.standard_normal((24, 16)) * 0.5).astype(np.float32),
               "ip1.bias": rng.uniform(-0.1, 0.1, 24).astype(np.float32),
               "fc8.weight": rng.standard_normal((10, 24)).astype(np.float32),
               "fc8.bias": rng.standard_normal(10).astype(np.float32)}
    save_weights(str(folder / "pretrained.safetensors"), weights)
    centres = rng.standard_normal((3, 16)) * 1.5
    label = rng.integers(0, 3, 240)
    data = (centres[label] + rng.standard_normal((240, 16))).astype(np.float32)
    np.savez(folder / "three.npz", data=data, label=label.astype(np.int64))
    return weights


TRAIN = ["--set", "train.max_iter=60", "--set", "train.test_interval=60", "--set", "train.data.batch_size=32",
         "--set", "train.solver.base_lr=0.1", "--set", "train.solver.momentum=0.9"]


def test_new_head_fine_tunes_a_deploy_net_from_its_weights(tmp_path):
    given = _pretrained(tmp_path)
    r = cli("train", tmp_path / "deploy.yaml", "--weights", tmp_path / "pretrained.safetensors", "--new-head", "3",
            "--set", f"train.data.source={tmp_path / 'three.npz'}", *TRAIN, "--out", tmp_path / "run")
    assert r.status == 0, r.err
    assert "new head: layer 'fc8' (InnerProduct, 10 outputs before 'prob') replaced by one of 3 outputs" in r.err
    assert "added the input 'label'" in r.err and "added 'loss' (SoftmaxWithLoss" in r.err
    # the note on what was left out of the file: the old head's arrays, by name and both shapes
    assert any(line.split()[:4] == ["fc8", "fc8.weight", "[10,", "24]"] and "left out" in line
               for line in r.err.splitlines()), r.err
    accuracy = float(r.out.split("accuracy ")[1].split(";")[0])
    assert accuracy > 0.8, r.out                 # chance is 1/3
    trained = load_file(str(tmp_path / "run" / "model.safetensors"))
    np.testing.assert_array_equal(trained["ip1.weight"], given["ip1.weight"])    # copied, then frozen
    np.testing.assert_array_equal(trained["ip1.bias"], given["ip1.bias"])
    assert trained["fc8.weight"].shape == (3, 24)
    # the run's own net file has the new head, and resumes as it stands
    recorded = (tmp_path / "run" / "net.yaml").read_text()
    assert "num_output: 3" in recorded and "SoftmaxWithLoss" in recorded and "phase: infer" in recorded


def test_the_copied_weights_are_the_files_and_the_head_its_fillers(tmp_path):
    given = _pretrained(tmp_path)
    net, _notes = with_new_head(load_net(str(tmp_path / "deploy.yaml")), 3)
    lines = []
    start = net.load_weights(str(tmp_path / "pretrained.safetensors"), say=lines.append)
    np.testing.assert_array_equal(start["ip1.weight"], given["ip1.weight"])
    np.testing.assert_array_equal(start["ip1.bias"], given["ip1.bias"])
    fillers = net.init_weights(seed=0)
    np.testing.assert_array_equal(start["fc8.weight"], fillers["fc8.weight"])
    assert start["fc8.weight"].shape == (3, 24) and not start["fc8.bias"].any()
    assert lines[0].endswith("copied 2 of the net's 4 arrays")
    # the same width as before is still a new head: the file's fc8 is not copied
    same, _ = with_new_head(load_net(str(tmp_path / "deploy.yaml")), 10)
    kept = same.load_weights(str(tmp_path / "pretrained.safetensors"))
    assert not np.array_equal(kept["fc8.weight"], given["fc8.weight"])


def test_new_head_needs_weights_and_training_data(tmp_path):
    _pretrained(tmp_path)
    r = cli("train", tmp_path / "deploy.yaml", "--new-head", "3", "--out", tmp_path / "run")
    assert r.status == 2 and r.errors == ["error: --new-head goes with --weights FILE|zoo:NAME (the trained weights of "
                                          "the other layers)"]
    r = cli("train", tmp_path / "deploy.yaml", "--weights", tmp_path / "pretrained.safetensors", "--new-head", "3",
            "--out", tmp_path / "run")
    assert r.status == 2 and "Traceback" not in r.err
    assert r.errors == ["error: --new-head: pretrained says nothing of its training data; give it in the net file's "
                        "train.data or with --set train.data.source=PATH (an image folder, .npz, CSV, ...)"]
    assert not (tmp_path / "run").exists()


def test_new_head_says_why_a_net_has_no_classifier(tmp_path):
    (tmp_path / "net.yaml").write_text("name: plain\ninputs:\n  data: {shape: [N, 4]}\nlayers:\n"
                                       "  - {name: e, type: Eltwise, bottom: [data, data], top: e}\n"
                                       "train: {data: {source: x.npz}}\n")
    r = cli("train", tmp_path / "net.yaml", "--weights", tmp_path / "w.safetensors", "--new-head", "3")
    assert r.status == 2 and len(r.errors) == 1
    assert r.errors[0].startswith("error: output 'e' comes from layer 'e' (Eltwise), which is not a "
                                  "classifier's last step")


# -- the same in a derived net -----------------------------------------------------------------
DERIVED = """\
base: deploy.yaml
name: three-classes
inputs:
  label: {shape: [N], dtype: int64}
layers:
  - {name: fc8, delete: true}
  - {name: fc8, type: InnerProduct, bottom: ip1, top: fc8, num_output: 3}
  - {name: prob, phase: infer}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc8, label], top: loss, phase: train}
  - {name: accuracy, type: Accuracy, bottom: [fc8, label], top: accuracy, phase: test}
train:
  data: {source: three.npz}
"""


def test_a_derived_net_deletes_and_rewrites_its_classifier(tmp_path):
    given = _pretrained(tmp_path)
    (tmp_path / "derived.yaml").write_text(DERIVED)
    net = load_net(str(tmp_path / "derived.yaml"))
    # the new fc8 stands where the old one stood: before the Softmax that reads it
    assert [layer.name for layer in net.spec.layers] == ["ip1", "relu1", "fc8", "prob", "loss", "accuracy"]
    assert net.fresh_layers == {"fc8"}
    start = net.load_weights(str(tmp_path / "pretrained.safetensors"))     # no --allow-missing needed
    np.testing.assert_array_equal(start["ip1.weight"], given["ip1.weight"])
    assert start["fc8.weight"].shape == (3, 24)
    r = cli("train", tmp_path / "derived.yaml", "--weights", tmp_path / "pretrained.safetensors", *TRAIN,
            "--out", tmp_path / "run")
    assert r.status == 0, r.err
    assert float(r.out.split("accuracy ")[1].split(";")[0]) > 0.8, r.out


def test_a_name_written_twice_without_a_delete_between_is_still_refused(tmp_path):
    _pretrained(tmp_path)
    (tmp_path / "twice.yaml").write_text(DERIVED.replace("  - {name: fc8, delete: true}\n",
                                                         "  - {name: fc8, num_output: 5}\n"))
    with pytest.raises(SpecError) as e:
        load_net(str(tmp_path / "twice.yaml"))
    assert "layer name 'fc8' is already used (line 6)" in str(e.value)


def test_a_bottom_written_above_but_merged_below_says_the_real_order(tmp_path):
    _pretrained(tmp_path)
    (tmp_path / "feat.yaml").write_text(textwrap.dedent("""\
        base: deploy.yaml
        name: wider
        layers:
          - {name: feat, type: ReLU, bottom: ip1, top: feat}
          - {name: fc8, bottom: feat}
        """))
    with pytest.raises(SpecError) as e:
        load_net(str(tmp_path / "feat.yaml"))
    message = str(e.value)
    # line 4 is above line 5 in the file; in the merged net fc8 keeps the base's third place and
    # the new layer goes fifth
    assert "bottom 'feat' is produced by layer 'feat' (line 4), which comes after this layer in the merged net " \
           "(layer 5 against 3" in message, message
    assert "place it with `after: relu1` on layer 'feat'" in message and "produced only below" not in message


# SqueezeNet's deploy head: a 1x1 convolution, ReLU and global pooling give [N, C, 1, 1] scores
SQUEEZE = """\
name: squeeze-like
inputs:
  data: {shape: [N, 3, 6, 6]}
layers:
  - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 8, kernel_size: 3, pad: 1}
  - {name: relu1, type: ReLU, bottom: conv1, top: conv1}
  - {name: conv10, type: Convolution, bottom: conv1, top: conv10, num_output: 10, kernel_size: 1}
  - {name: relu10, type: ReLU, bottom: conv10, top: conv10}
  - {name: pool10, type: Pooling, bottom: conv10, top: pool10, pool: ave, global_pooling: true}
  - {name: prob, type: Softmax, bottom: pool10, top: prob}
"""


def test_new_head_of_a_convolutional_classifier_with_global_pooling(tmp_path):
    (tmp_path / "squeeze.yaml").write_text(SQUEEZE)
    rng = np.random.default_rng(4)
    start = load_net(str(tmp_path / "squeeze.yaml")).init_weights(seed=1)
    save_weights(str(tmp_path / "squeeze.safetensors"), start)
    label = rng.integers(0, 3, 180)
    data = rng.standard_normal((180, 3, 6, 6)).astype(np.float32) * 0.5
    data[np.arange(180), label] += 1.5                  # the class is the brightest channel
    np.savez(tmp_path / "images.npz", data=data, label=label.astype(np.int64))
    r = cli("train", tmp_path / "squeeze.yaml", "--weights", tmp_path / "squeeze.safetensors", "--new-head", "3",
            "--set", f"train.data.source={tmp_path / 'images.npz'}", *TRAIN, "--out", tmp_path / "run")
    assert r.status == 0, r.err
    assert "new head: layer 'conv10' (Convolution, 10 outputs before 'prob') replaced by one of 3 outputs" in r.err
    assert "added 'loss' (SoftmaxWithLoss of 'pool10' and 'label', phase train)" in r.err
    assert float(r.out.split("accuracy ")[1].split(";")[0]) > 0.6, r.out  # chance is 1/3
    trained = load_file(str(tmp_path / "run" / "model.safetensors"))
    assert trained["conv10.weight"].shape == (3, 8, 1, 1)


def test_training_a_deploy_net_without_a_new_head_says_how(tmp_path):
    _pretrained(tmp_path)
    r = cli("train", tmp_path / "deploy.yaml", "--set", f"train.data.source={tmp_path / 'three.npz'}",
            "--set", "train.max_iter=5", "--out", tmp_path / "run")
    assert r.status == 2 and len(r.errors) == 1
    assert r.errors[0].endswith("the train phase has no loss layer (a type ending in 'Loss', or train.losses); to "
                                "fine-tune a deploy net's classifier, `toolkit train NET --weights W --new-head "
                                "NUM_CLASSES` adds one")
