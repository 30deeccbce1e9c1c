"""Sizes a user or a file gives, bounded before anything of that size is allocated: buckets over
any symbolic dimension (--buckets, a net file's buckets, the Python API), integers longer than
any field holds (a net file, --set, --buckets), ragged sequence lengths whose padding or sum is out of reach, and a
parameter count past 2**64. Each is one line with exit status 2 (or, for a count, the exact
number) from the real CLI in a child process under tests/bounded.py's bounds."""
from __future__ import annotations

import numpy as np
import pytest

from tests.bounded import run_toolkit

TAGGER = """\
name: tagger
inputs:
  data: {shape: [N, T, 6], dtype: float32}
layers:
  - {name: embed, type: InnerProduct, bottom: data, top: tok, num_output: 8, axis: 2}
  - {name: gru, type: GRU, bottom: tok, top: [seq, h], num_output: 4}
  - {name: tags, type: InnerProduct, bottom: seq, top: tags, num_output: 3, axis: 2}
outputs: [tags]
"""
BILLION = 1_000_000_000
MEMORY_MB = 1500          # an address-space limit: the memory this process may use is known


@pytest.fixture
def tagger(tmp_path):
    """The net, its weights and a batch of two sequences of five steps."""
    from toolkit import Net
    from toolkit.weights import save_weights
    (tmp_path / "tagger.yaml").write_text(TAGGER)
    save_weights(str(tmp_path / "w.safetensors"), Net(str(tmp_path / "tagger.yaml")).init_weights(seed=1))
    np.save(tmp_path / "x.npy", np.zeros((2, 5, 6), np.float32))
    return tmp_path


def infer(folder, *args, net="tagger.yaml"):
    return run_toolkit("infer", folder / net, "--weights", folder / "w.safetensors", "--input",
                       f"data={folder / 'x.npy'}", *args, memory_mb=MEMORY_MB, timeout=60)


def one_line(r, said: str) -> None:
    assert r.status == 2 and len(r.lines) == 1 and said in r.lines[0], r.err
    assert r.seconds < 30, r.seconds


@pytest.mark.parametrize("buckets, sizes, size", [
    ("T=4,1000000000", "T=1,000,000,000, N=64", "1.4 TiB"),
    ("N=1000000000", "N=1,000,000,000", "22.4 GiB"),
    ("1000000000", "N=1,000,000,000", "22.4 GiB"),
], ids=["bucket T", "bucket N", "batch buckets"])
def test_buckets_past_memory_are_refused_before_padding(tagger, buckets, sizes, size):
    """A batch of two padded to a billion rows or steps allocated 44.7 GiB (numpy's MemoryError)."""
    r = infer(tagger, "--buckets", buckets)
    one_line(r, f"error: the largest buckets ({sizes}) make inputs of {size}, more than the ")
    assert r.lines[0].endswith("of memory available; give smaller ones (--buckets, or the net file's buckets)")


def test_a_net_files_bucket_past_memory_is_refused(tagger):
    (tagger / "bucketed.yaml").write_text(TAGGER + f"buckets: {{T: [4, {BILLION}]}}\n")
    one_line(infer(tagger, net="bucketed.yaml"), "error: the largest buckets (T=1,000,000,000, N=64) make "
                                               "inputs of 1.4 TiB")


@pytest.mark.parametrize("bucket, said", [
    (10 ** 30, "bucketed.yaml:9:18: error: the integer 1000000000000000000000000000000 is more than any field holds "
               "(64 bits)"),
    (1 << 40, "bucketed.yaml:9:18: error: bad 'T': input should be less than or equal to 2147483647"),
], ids=["1e30", "2**40"])
def test_a_bucket_beyond_any_size_is_refused_at_its_place(tagger, bucket, said):
    """A bucket of 1e30 was numpy's TypeError ('pad_width must be of integral type')."""
    (tagger / "bucketed.yaml").write_text(TAGGER + f"buckets: {{T: [4, {bucket}]}}\n")
    one_line(run_toolkit("check", tagger / "bucketed.yaml", memory_mb=MEMORY_MB, timeout=60), said)
    one_line(infer(tagger, net="bucketed.yaml"), said)


def test_serve_refuses_buckets_past_memory_at_start(tagger):
    """It started, and answered every request with 500."""
    r = run_toolkit("serve", tagger / "tagger.yaml", "--weights", tagger / "w.safetensors", "--port", "0",
                    "--buckets", BILLION, memory_mb=MEMORY_MB, timeout=60)
    one_line(r, "error: the largest buckets (N=1,000,000,000) make inputs of 22.4 GiB")


def test_the_python_api_refuses_a_bucket_beyond_any_size(tagger):
    import toolkit
    from toolkit.errors import UserError
    for buckets, said in (([10 ** 30], "buckets: each size must be from 1 to 2,147,483,647, got about 1.0e\\+30"),
                          ({"N": [1, 1 << 40]}, "buckets N: each size must be from 1 to 2,147,483,647, got "
                                                "1,099,511,627,776")):
        with pytest.raises(UserError, match=said):
            toolkit.load(str(tagger / "tagger.yaml"), weights=str(tagger / "w.safetensors"), buckets=buckets)


DIGITS = "9" * 5000


def test_an_integer_of_5000_digits_is_refused_wherever_it_is_given(tagger):
    """Python's limit on converting 4,300 digits was a traceback in a net file and --set."""
    (tagger / "big.yaml").write_text(TAGGER.replace("num_output: 8", f"num_output: {DIGITS}"))
    one_line(run_toolkit("check", tagger / "big.yaml", memory_mb=MEMORY_MB),
             "big.yaml:5:75: error: an integer of 5,000 digits is more than any field holds (64 bits)")
    one_line(run_toolkit("check", tagger / "tagger.yaml", "--set", f"layers.embed.num_output={DIGITS}",
                         memory_mb=MEMORY_MB),
             "error: --set layers.embed.num_output: an integer of 5,000 digits is more than any field holds (64 bits)")
    one_line(run_toolkit("check", tagger / "tagger.yaml", "--set", f"layers.embed.num_output={10 ** 24}",
                         memory_mb=MEMORY_MB),
             f"error: --set layers.embed.num_output: the integer {10 ** 24} is more than any field holds (64 bits)")
    one_line(infer(tagger, "--buckets", f"N={DIGITS}"),
             f"error: argument --buckets: 'N={'9' * 38}...': a bucket size may be at most 2,147,483,647")
    one_line(run_toolkit("bench", tagger / "tagger.yaml", "--batch", DIGITS, memory_mb=MEMORY_MB),
             f"error: argument --batch: '{'9' * 40}...' is more than any size this takes")
    one_line(run_toolkit("bench", tagger / "tagger.yaml", "--batch", 1, "--dim", f"T={DIGITS}", memory_mb=MEMORY_MB),
             f"error: --dim T={'9' * 58}...: expected NAME=SIZE with a positive size of at most 18 digits")


def test_a_count_of_parameters_past_2_64_is_exact(tmp_path):
    """10**24 weights: the count wrapped past 2**64 (2,003,765,205,206,896,640)."""
    (tmp_path / "huge.yaml").write_text(
        "name: huge\ninputs:\n  data: {shape: [N, 1000000000000], dtype: float32}\nlayers:\n"
        "  - {name: ip, type: InnerProduct, bottom: data, top: out, num_output: 1000000000000}\n")
    r = run_toolkit("check", tmp_path / "huge.yaml", memory_mb=MEMORY_MB, timeout=60)
    assert r.status == 0, r.err
    assert "total: 1,000,000,000,001,000,000,000,000 parameters" in r.out, r.out


SEQUENCES = """\
name: cls
inputs:
  data: {shape: [N, T, 3]}
  label: {shape: [N], dtype: int64}
layers:
  - {name: rec, type: GRU, bottom: data, top: h, num_output: 5, return_sequence: false}
  - {name: fc, type: InnerProduct, bottom: h, top: fc, num_output: 3}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
train:
  data: {source: seqs.npz, lengths: lengths, batch_size: 6, shuffle: false, test_fraction: 0.0}
  solver: {type: sgd, base_lr: 0.2}
  max_iter: 2
"""


def train(folder):
    (folder / "net.yaml").write_text(SEQUENCES)
    return run_toolkit("train", folder / "net.yaml", "--out", folder / "run", memory_mb=MEMORY_MB, timeout=60,
                       cwd=folder)


def test_ragged_lengths_whose_padding_is_past_memory_are_refused(tmp_path):
    """One sequence of 200,000 steps among 200,000 of one step (a 9 kB npz) asked for 447 GiB."""
    n = 200_000
    np.savez_compressed(tmp_path / "seqs.npz", data=np.zeros((2 * n - 1, 3), np.float32),
                        label=np.zeros(n, np.int64), lengths=np.array([n] + [1] * (n - 1)))
    r = train(tmp_path)
    one_line(r, "error: data source seqs.npz: its 200,000 sequences of 'data' padded to the longest (200,000 steps) "
                "take 447.0 GiB, more than the ")
    assert not (tmp_path / "run").exists()


def test_ragged_lengths_whose_int64_sum_wraps_are_refused(tmp_path):
    """Four lengths of about 2**62 sum, wrapped, to the five steps stored: it padded to 2**62."""
    lengths = np.array([1 << 62, 1 << 62, 1 << 62, (1 << 62) + 5], np.int64)
    assert int(lengths.sum()) == 5
    np.savez(tmp_path / "seqs.npz", data=np.zeros((5, 3), np.float32), label=np.zeros(4, np.int64), lengths=lengths)
    r = train(tmp_path)
    one_line(r, "error: data source seqs.npz: ")
    assert not (tmp_path / "run").exists()


LAYER = "name: t\ninputs:\n  data: {{shape: {shape}, dtype: float32}}\nlayers:\n  - {layer}\n"


@pytest.mark.parametrize("shape, layer, said", [
    ("[N, 5, 3]", "{name: r, type: GRU, bottom: data, top: y, num_output: 2, num_layers: 1000000000}",
     "net.yaml:5:75: error: layer 'r' (GRU): bad 'num_layers': input should be less than or equal to 1000"),
    ("[N, 1000000000, 3]", "{name: r, type: GRU, bottom: data, top: y, num_output: 2, unroll: true}",
     "net.yaml:5:63: error: layer 'r' (GRU): unroll: true over T=1,000,000,000 steps: at most 4,096 unroll; "
     "leave unroll out to run the steps as one loop"),
], ids=["stacked layers", "unrolled steps"])
def test_a_layer_parameter_that_sizes_the_graph_is_bounded(tmp_path, shape, layer, said):
    """Each stacked layer and unrolled step is a section of the graph: a billion of them built
    for ever."""
    (tmp_path / "net.yaml").write_text(LAYER.format(shape=shape, layer=layer))
    one_line(run_toolkit("check", tmp_path / "net.yaml", memory_mb=MEMORY_MB, timeout=60), said)


def test_a_tile_of_a_billion_is_three_nodes_and_its_output_is_checked_against_memory(tmp_path):
    """It was a concat of a billion inputs: MemoryError while the net was read."""
    (tmp_path / "net.yaml").write_text(LAYER.format(
        shape="[N, 3, 8, 8]", layer="{name: t, type: Tile, bottom: data, top: y, tiles: 1000000000, axis: 1}"))
    r = run_toolkit("check", tmp_path / "net.yaml", memory_mb=MEMORY_MB, timeout=60)
    assert r.status == 0 and "[N, 3000000000, 8, 8]" in r.out, r.err
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 8, 8), np.float32))
    r = run_toolkit("infer", tmp_path / "net.yaml", "--input", f"data={tmp_path / 'x.npy'}", memory_mb=MEMORY_MB,
                    timeout=60)
    one_line(r, "error: layer 't': its broadcast_to output [64, 1000000000, 3, 8, 8] (float32) is 44.7 TiB")
