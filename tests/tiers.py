"""The suite's tiers, read by tests/conftest.py: which tests are in the fast tier and which
folders run the generated C kernels. Entries are pytest's test ids below the repository: a
folder ("tests/ir/"), a file ("tests/ops/test_op_table.py") or one test ("FILE::NAME").

The fast tier (``make test-fast``: ``pytest -m fast`` with the numpy kernels) is the unit tests
of every package, held to a minute on two cores: a test that starts processes, compiles C or
trains for seconds is not fast, and goes in ``NOT_FAST`` when the rest of its file is. ``make
test`` runs every tier.

``NATIVE_FOLDERS`` (below tests/) run the generated C kernels, what users get by default, unless
TOOLKIT_NATIVE is given: the commands, the zoo, the server, the front end's hostile nets and
the documentation's examples, end to end, where one compiled unit serves many runs (tests/cli
and tests/zoo take 53 s on two workers either way: the compiles cost no more than the numpy
kernels' slower runs). Elsewhere thousands of one-off plans would each compile a unit of their
own, so they run the numpy kernels (tests/kernels/test_native.py runs every op case both ways and compares them).
"""
from __future__ import annotations

NATIVE_FOLDERS = ("serve", "frontend", "zoo", "cli", "docs")

# Tests in those folders that keep the numpy kernels: each compares runs of different batch sizes
# more tightly than float32 rounding, which the native kernels' blocking changes with the batch.
NUMPY_KERNELS = (
    # the server pads the batch to a bucket; the scores it prints are held to 1e-6 of an unpadded run
    "tests/serve/test_serve_classify.py::test_classification_as_triton_answers_it",
)

FAST = (
    "tests/arrayfiles/test_files.py", "tests/arrayfiles/test_images.py", "tests/arrayfiles/test_npy.py",
    "tests/arrayfiles/test_table.py",
    "tests/backend/test_placement.py", "tests/backend/test_registry.py",
    "tests/cli/test_dtype_flags.py", "tests/cli/test_infer_inputs.py",
    "tests/codegen/test_loops.py",
    "tests/importers/test_onnx_written_ops.py",
    "tests/ir/",
    "tests/layers/test_causal_symbolic.py", "tests/layers/test_default_outputs.py",
    "tests/layers/test_infer_mixed_nets.py", "tests/layers/test_recurrent_final_state.py",
    "tests/ops/",
    "tests/passes/test_canonical.py", "tests/passes/test_compile_memory.py", "tests/passes/test_fusion.py",
    "tests/passes/test_gemm.py", "tests/passes/test_pipeline.py", "tests/passes/test_simplify.py",
    "tests/runtime/test_concurrency.py", "tests/runtime/test_memory.py", "tests/runtime/test_parallel.py",
    "tests/runtime/test_plan.py", "tests/runtime/test_plan_build.py", "tests/runtime/test_team.py",
    "tests/kernels/test_blocked_layout.py", "tests/kernels/test_conv_blocks.py", "tests/kernels/test_winograd.py",
    "tests/schemas/",
    "tests/serve/test_api.py",
    "tests/docs/test_links.py", "tests/test_house_rules.py", "tests/test_packaging.py",
    "tests/train/test_data.py", "tests/train/test_fillers.py", "tests/optim/test_solvers.py",
    "tests/zoo/test_card_classes.py", "tests/zoo/test_cards.py", "tests/zoo/test_sources.py",
)

NOT_FAST = (
    "tests/test_house_rules.py::test_pytest_the_script_collects_what_imports_the_repository_packages",
    "tests/serve/test_api.py::test_many_threads_get_their_own_answers",
    "tests/runtime/test_team.py::test_a_smaller_team_gives_the_same_train_step",
)


def listed(nodeid: str, entries) -> bool:
    """Whether the test ``nodeid`` (FILE::NAME[PARAMS]) is in one of ``entries``."""
    return any(nodeid.startswith(e) if e.endswith("/") else nodeid == e or nodeid.startswith((e + "::", e + "["))
               for e in entries)


if __name__ == "__main__":
    # `python -m tests.tiers`: the files and folders of the fast tier, so that `make test-fast`
    # collects those alone rather than importing every test module to deselect most of them
    print(" ".join(dict.fromkeys(entry.partition("::")[0] for entry in FAST)))
