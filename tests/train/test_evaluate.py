"""The public evaluation, toolkit.training.evaluate.evaluate: the example-weighted means of the
test phase's scalar outputs over a split of the net's data, from weights given as arrays or as
a file, against numpy on the same examples; the splits it knows, and what it refuses."""
from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.train.train_helpers import net_data, softmax_xent, train
from toolkit.errors import UserError
from toolkit.training.evaluate import NoTestData, evaluate


def test_evaluate_each_split_from_arrays_or_a_file(softreg_net, tmp_path):
    train(softreg_net, tmp_path / "run")
    path = tmp_path / "run" / "model.safetensors"
    weights = load_file(path)
    net, _spec, train_set, test_set, _order = net_data(softreg_net)
    for split, examples in (("test", test_set), ("train", train_set)):
        xent, acc = softmax_xent(weights, examples.arrays["data"], examples.arrays["label"])
        for given in (dict(weights), str(path)):
            result = evaluate(net, given, split)
            assert result.examples == len(examples) == {"test": 15, "train": 45}[split]
            assert result.metrics["xent"] == pytest.approx(xent, rel=1e-5)
            assert result.metrics["acc"] == pytest.approx(acc, abs=1e-6)
    assert not np.isclose(evaluate(net, str(path), "train").metrics["xent"], evaluate(net, str(path)).metrics["xent"])


def test_evaluate_refuses_a_missing_split_in_a_line(softreg_net, tmp_path):
    train(softreg_net, tmp_path / "run")
    path = str(tmp_path / "run" / "model.safetensors")
    net, *_ = net_data(softreg_net, "train.data.test_fraction=0")
    with pytest.raises(NoTestData, match="the net's data has no test split: set train.data.test_fraction or "
                                         "test_source"):
        evaluate(net, path)
    with pytest.raises(UserError, match=r"no split 'valid' to evaluate \(the splits are: test, train\)"):
        evaluate(net, path, "valid")
