"""``toolkit check`` counts the weights of an If or Loop block: they are declared under the
names of the layers inside it, not under the block's own name."""
from __future__ import annotations

from cli_helpers import run_cli, write_net

from toolkit.frontend.net import Net

# A Loop whose body has two InnerProducts (4*8+4 and 4*4 weights), then an If holding a Loop in
# one branch (8*8+8 per trip, shared) and an InnerProduct without bias (8*4) in the other.
NET = """
name: blocks
inputs:
  x: {shape: [N, T, 8]}
  h0: {shape: [N, 4]}
layers:
  - name: rnn
    type: Loop
    scan: {x_t: x}
    carry: {h: h0}
    top: [h_last, hs]
    output: {h_last: h}
    stack: {hs: h}
    body:
      - {name: inp, type: InnerProduct, bottom: x_t, top: a, num_output: 4}
      - {name: rec, type: InnerProduct, bottom: h, top: r, num_output: 4, bias_term: false}
      - {name: sum, type: Eltwise, bottom: [a, r], top: s}
      - {name: act, type: TanH, bottom: s, top: h}
  - name: pick
    type: If
    condition: true
    top: y
    then:
      - name: inner
        type: Loop
        trips: 3
        carry: {g: h_last}
        top: y
        output: {y: g}
        body:
          - {name: ip1, type: InnerProduct, bottom: g, top: g, num_output: 4}
    else: [{name: ip2, type: InnerProduct, bottom: h_last, top: y, num_output: 4, bias_term: false}]
outputs: [y, hs]
"""


def _rows(out: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in out.splitlines()[2:-1]}


def test_a_block_counts_the_weights_of_its_layers(tmp_path):
    path = write_net(tmp_path, NET)
    result = run_cli("check", path)
    assert result.status == 0, result.err
    rows = _rows(result.out)
    assert rows["rnn"][1] == "Loop" and rows["rnn"][-3] == "52"      # 4*8 + 4 + 4*4
    assert rows["pick"][1] == "If" and rows["pick"][-3] == "36"      # 4*4 + 4 + 4*4 (nested)
    # The same count from the weights the net's fillers make, summed independently.
    weights = Net.load(str(path)).init_weights()
    by_layer = {}
    for key, array in weights.items():
        by_layer[key.split(".")[0]] = by_layer.get(key.split(".")[0], 0) + array.size
    assert by_layer == {"inp": 36, "rec": 16, "ip1": 20, "ip2": 16}
    assert f"total: {sum(by_layer.values())} parameters;" in result.out
    assert rows["rnn"][-2] != "0" and rows["pick"][-2] != "0"        # FLOPs counted too
