"""Net files that try to exhaust the reader: a base that is a device or a FIFO, a file larger
than any net, bases named over and over, YAML merge keys that expand; each one line with exit
status 2 (or, for a legitimate deep chain, a net that checks), in bounded time and memory."""
from __future__ import annotations

import os

import pytest

from tests.bounded import ROOT, run_toolkit
from toolkit.frontend.spec import MAX_NET_BYTES
from toolkit.frontend.yaml_loader import MAX_NODES, load_yaml

LENET = ROOT / "zoo" / "lenet" / "net.yaml"


def derived(tmp_path, base: str):
    path = tmp_path / "net.yaml"
    path.write_text(f"base: {base}\nname: derived\n")
    return path


@pytest.mark.parametrize("kind", ["device", "fifo", "folder"])
def test_a_base_that_is_not_a_regular_file_is_refused_at_once(tmp_path, kind):
    target = {"device": "/dev/zero", "fifo": str(tmp_path / "pipe.yaml"), "folder": str(tmp_path / "sub")}[kind]
    if kind == "fifo":
        os.mkfifo(target)
    if kind == "folder":
        os.mkdir(target)                       # a folder without net.yaml
    r = run_toolkit("check", derived(tmp_path, target), memory_mb=400, timeout=30)
    assert r.status == 2 and len(r.lines) == 1 and r.seconds < 20, r.err
    said = {"device": "/dev/zero: is not a regular file (it is a character device)",
            "fifo": f"{target}: is not a regular file (it is a FIFO)",
            "folder": "is a folder without a net.yaml"}[kind]
    assert r.lines[0].startswith(f"{tmp_path / 'net.yaml'}:1:7: error: base '{target}'") and said in r.lines[0], r.err


def test_a_net_file_larger_than_any_net_is_refused_unread(tmp_path):
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.write(b"# " + b"x" * (MAX_NET_BYTES + 16) + b"\n")
    r = run_toolkit("check", big, memory_mb=400, timeout=30)
    assert r.status == 2 and r.lines == [f"error: {big}: a net file may be at most {MAX_NET_BYTES:,} bytes; "
                                         "this one is larger"], r.err


def test_a_base_named_twice_at_every_level_is_composed_once(tmp_path):
    """``base: [prev, prev]`` sixteen deep: two to the sixteenth compositions before, sixteen now."""
    (tmp_path / "b0.yaml").write_text(LENET.read_text())
    for i in range(1, 17):
        (tmp_path / f"b{i}.yaml").write_text(f"base: [b{i - 1}.yaml, b{i - 1}.yaml]\nname: n{i}\n")
    r = run_toolkit("check", tmp_path / "b16.yaml", timeout=60)
    assert r.status == 0 and r.seconds < 20, r.err
    assert "total: 13,706 parameters" in r.out


def merge_doubling(levels: int) -> str:
    """Each level merges the one below twice: PyYAML before 6.0.4 doubled the keys at each level."""
    lines = ["name: bomb", "l0: &l0 {a: 1, b: 2}"]
    lines += [f"l{i}: &l{i} {{<<: [*l{i - 1}, *l{i - 1}]}}" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_merge_keys_merged_twice_do_not_double(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(merge_doubling(40))
    r = run_toolkit("check", path, memory_mb=400, timeout=30)
    assert r.status == 2 and r.seconds < 20, r.err        # the keys l0..l39 are no net's keys
    assert f"{path}:2:1: error: unknown key 'l0'" in r.lines


def test_merged_keys_count_against_the_node_limit():
    """Many mappings merging one wide mapping: each merged key counts, as if written out."""
    wide = ", ".join(f"k{i}: {i}" for i in range(1000))
    text = f"w: &w {{{wide}}}\n" + "".join(f"m{j}: {{<<: *w}}\n" for j in range(MAX_NODES // 1000 + 1))
    with pytest.raises(Exception, match=f"more than {MAX_NODES:,} values"):
        load_yaml(text, "merges.yaml")


def test_merge_keys_follow_yaml_precedence():
    """A key of the mapping wins over a merged one; of the merged mappings, the earlier wins."""
    data, _ = load_yaml("a: &a {x: 1, y: 1, name: a}\nb: &b {x: 2, z: 2}\nm: {<<: [*a, *b], y: 3}\n", "m.yaml")
    assert data["m"] == {"x": 1, "y": 3, "name": "a", "z": 2}
