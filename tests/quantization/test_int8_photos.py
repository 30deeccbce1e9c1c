"""benchmarks/int8_photos.py, int8 against float32 on real photos: its figures (top-1 agreement,
top-5 overlap, accuracy on the labelled rows) against hand counts, and its split of the listed
photos into calibration and evaluation sets that share no photo."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("int8_photos", ROOT / "benchmarks" / "int8_photos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_scores_count_agreement_overlap_and_accuracy_by_hand():
    fp32 = np.array([[9, 8, 7, 6, 5, 0, 0], [0, 1, 2, 3, 4, 5, 6]], np.float32)
    other = np.array([[8, 9, 7, 6, 0, 5, 0], [0, 1, 2, 3, 4, 5, 6]], np.float32)
    found = _script().scores(fp32[:, :, None, None], other[:, :, None, None], [1, None])
    # row 0: top-1 moves from 0 to 1, top-5 {0,1,2,3,4} against {1,0,2,3,5}: 4 shared; row 1 the same
    assert (found["n"], found["top1_agree"]) == (2, 1)
    assert found["top5_overlap"] == pytest.approx((4 + 5) / 10)
    assert (found["labelled"], found["top1"], found["top5"]) == (1, 1, 1)


def test_the_listed_photos_split_into_disjoint_calibration_and_evaluation_sets(tmp_path):
    sources = {"groups": [
        {"repo": "a/b", "commit": "0" * 40, "files": [[f"n{i}.JPEG", i] for i in range(30)]},
        {"repo": "c/d", "commit": "1" * 40, "prefix": "c-", "files": ["images/cat.jpg"]}]}
    (tmp_path / "sources.json").write_text(json.dumps(sources))
    photos = tmp_path / "photos"
    photos.mkdir()
    for name in [f"n{i}.JPEG" for i in range(30) if i != 25] + ["c-cat.jpg"]:
        (photos / name).write_bytes(b"")
    script = _script()
    calibration, evaluation = script.split(script.read_sources(str(tmp_path / "sources.json")), photos)
    assert [e["file"] for e in calibration] == ["n5.JPEG", "n15.JPEG"]      # n25 is not in the folder
    assert len(evaluation) == 28 and "c-cat.jpg" in [e["file"] for e in evaluation]
    assert not {e["file"] for e in calibration} & {e["file"] for e in evaluation}


def test_the_committed_list_names_real_photos_with_imagenet_labels():
    sources = _script().read_sources(str(ROOT / "benchmarks" / "int8_photos_sources.json"))
    labelled = [e for e in sources if e["label"] is not None]
    assert len(labelled) == 1000 and sorted(e["label"] for e in labelled) == list(range(1000))
    # the label is the photo's WordNet id's place among the 1000 sorted ids
    wnids = sorted(e["file"].split("_")[0] for e in labelled)
    assert all(wnids[e["label"]] == e["file"].split("_")[0] for e in labelled)


def test_gather_writes_each_listed_file_from_its_repository_at_its_commit(tmp_path):
    import subprocess
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    (repo / "images").mkdir()
    (repo / "images" / "cat.jpg").write_bytes(b"first")
    subprocess.run(git + ["add", "images/cat.jpg"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "one"], check=True)
    first = subprocess.run(git[:3] + ["rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    (repo / "images" / "cat.jpg").write_bytes(b"second")
    subprocess.run(git + ["commit", "-q", "-am", "two"], check=True)
    sources = {"groups": [{"repo": "a/b", "commit": first, "prefix": "ab-", "files": ["images/cat.jpg"]},
                          {"repo": "c/d", "commit": "0" * 40, "files": [["x.JPEG", 3]]}]}
    (tmp_path / "sources.json").write_text(json.dumps(sources))
    args = _script().parse_args(["gather", "--repo", f"a/b={repo}", "--photos", str(tmp_path / "photos"),
                                 "--sources", str(tmp_path / "sources.json")])
    assert _script().gather(args) == 0
    assert sorted(p.name for p in (tmp_path / "photos").iterdir()) == ["ab-cat.jpg"]     # c/d: no snapshot given
    assert (tmp_path / "photos" / "ab-cat.jpg").read_bytes() == b"first"                # the listed commit's
