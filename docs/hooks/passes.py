"""The optimiser's page (explanations/passes.md), made from the pass pipeline each time the site builds.

Registered under ``hooks:`` in mkdocs.yml. The page is written into the build, never into docs/:
a hand-written head (what the pipeline is and how to look at it), then every stage of
``toolkit.passes.pipeline.PIPELINE`` in the order it runs, with its one-line contract, its group
(canonicalising or not), its function's docstring and its module's docstring; then the rules of
``simplify``'s table (``toolkit.passes.simplify.RULES``), each with the ops it matches and its
docstring (the algebra, then where it must not fire); then the switches a plan reads
(``PLAN_SWITCHES``). A stage or a rule whose function has no docstring stops the build with a
message naming it (reference.py's ``DriftError``): the page cannot drift from the code.

The page function needs no MkDocs: tests/docs/test_site.py calls it directly.
"""
from __future__ import annotations

import importlib.util
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = "explanations/passes.md"


def _reference():
    """reference.py, loaded by path (MkDocs loads each hook as a module of its own)."""
    module = sys.modules.get("docs_reference_hook")
    if module is None:
        spec = importlib.util.spec_from_file_location("docs_reference_hook", Path(__file__).with_name("reference.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


DriftError = _reference().DriftError

HEAD = """\
# The optimiser's passes

<!-- Generated from toolkit/passes/pipeline.py and the passes' docstrings when the site builds
(docs/hooks/passes.py). -->

Between the graph a net becomes (its forward pass, and for training its backward pass and the
solver's updates) and the plan that runs it, the toolkit runs one visible pipeline of named
passes (`PIPELINE` in `toolkit/passes/pipeline.py`). Each pass is a plain `Graph -> Graph`
function with a one-line contract. This page is made from that list and from the passes' own
docstrings, so it says what the code does.

**Canonicalising passes run first, to a fixpoint, and again after every other pass that changed
the graph.** What a pass leaves behind (a BatchNorm's scale now computed from constants, a
concatenation of weights, duplicate slices) is folded and merged before the next pass looks.

**A fusion fires only where it pays.** The kernel registry must have the fused kernel for the
graph's device and dtype, and the kernel must be faster there. For example,
`fuse_bias_gradient` has a plain CPU kernel, so that a graph fused for a GPU runs anywhere, but
the CPU's generated kernels run the two ops faster, so the pass never fires on the CPU.

**Where the weights are fixed, they become constants before the passes.** That is `infer`,
`test`, `bench` without `--train`, and `compile` of the infer and test phases. Everything computed
from the weights alone is then computed once, at compile time: a BatchNorm leaves no arithmetic
behind. A training run's test passes read the live weights and are not frozen.

**To see what the passes did** to a net, run `toolkit compile NET --explain` (nodes, FLOPs and
peak memory after each pass, and what each changed), or `--json` for the same as one object.
To switch a pass off, give its name to `--disable` (repeatable) on any command that compiles a
net, or `disable=[...]` to `toolkit.load`; `--no-optimize` switches off every pass but
`eliminate_dead_code`, `place_devices`, `schedule_collectives` and `plan_memory`. See
[the command line](../reference/commands.md).

**How the passes are proven equal.** Every pass has tests of what it changed and of the numbers
(the reference interpreter on the graph before and after, with 0, -0, inf and nan among the
inputs where floating point matters), and every `simplify` rule has a near miss where it must
not fire. `tests/passes/test_differential.py` draws random nets from the whole layer catalog
(a printed seed; `TOOLKIT_DIFF_SEED=...` replays one), shaped like what the passes rewrite, and
compares the optimised plan with the unoptimised graph's reference interpreter in the infer,
test and train phases; `make test-slow` runs 3000 of them.

**The memory planner** (`plan_memory`) is no stage of the pipeline but runs when a plan is built:
it places every buffer in one arena, lets views share their input's memory, runs kernels in
place where an input dies at their step, and writes the parts of a concatenation straight into
its output. `toolkit compile --json` reports its planned peak, the naive figure (one buffer per
value) and the lower bound (the most bytes live at one step).
"""


def _markdown(text: str) -> str:
    """A docstring as Markdown prose: its paragraphs' lines joined, ``code`` as `code`, and the
    characters Markdown would read as emphasis, HTML or a table's cell border escaped."""
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text.strip())]
    out = []
    for paragraph in paragraphs:
        parts = re.split(r"(``[^`]+``)", paragraph)
        out.append("".join(
            f"`{part[2:-2]}`" if part.startswith("``") else
            part.replace("\\", "\\\\").replace("*", r"\*").replace("_", r"\_").replace("<", "&lt;")
            .replace("|", r"\|")
            for part in parts))
    return "\n\n".join(out)


def _cell(text: str) -> str:
    """A docstring as one table cell (its paragraphs joined)."""
    return _markdown(text).replace("\n\n", " ")


def _doc(function) -> str:
    return inspect.getdoc(function) or ""


def stages(pipeline=None, rules=None, switches=None):
    """The pipeline's stages, simplify's rules (each once, with the ops it matches) and the plan's
    switches, as the code holds them (the arguments stand in for them in tests)."""
    from toolkit.passes import pipeline as module
    from toolkit.passes.simplify import RULES
    pipeline = module.PIPELINE if pipeline is None else pipeline
    rules = RULES if rules is None else rules
    switches = module.PLAN_SWITCHES if switches is None else switches
    ops: dict = {}
    for op, functions in rules.items():
        for function in functions:
            ops.setdefault(function, []).append(op)
    return list(pipeline), list(ops.items()), list(switches)


def missing_docstrings(pipeline, rules) -> list[str]:
    """``pass NAME`` and ``simplify rule NAME`` for each function without a docstring."""
    missing = [f"pass {stage.name} ({stage.run.__module__}.{stage.run.__name__})"
               for stage in pipeline if not _doc(stage.run)]
    missing += [f"simplify rule {function.__name__} ({function.__module__})"
                for function, _ in rules if not _doc(function)]
    return missing


def passes_page(pipeline=None, rules=None, switches=None) -> str:
    """The optimiser's page in Markdown; raises DriftError naming every pass or rule without a
    docstring."""
    pipeline, rules, switches = stages(pipeline, rules, switches)
    missing = missing_docstrings(pipeline, rules)
    if missing:
        raise DriftError("the optimiser's page would drift from the code:\n  "
                         + "\n  ".join(f"{name}: no docstring (say what the pass does, in its function's "
                                       "docstring)" for name in missing))
    out = [HEAD, "## The stages, in order", "",
           f"The {len(pipeline)} stages of the pipeline as they run. *Canonicalising* stages run "
           "together to a fixpoint first and after every other stage that changed the graph.", "",
           "| # | pass | group | contract |", "| --- | --- | --- | --- |"]
    for number, stage in enumerate(pipeline, 1):
        group = "canonicalising" if stage.canonical else "transform"
        out.append(f"| {number} | [`{stage.name}`](#{stage.name}) | {group} | {_cell(stage.contract)} |")
    out += [""]
    shown_modules = {"toolkit.passes.pipeline"}     # its docstring is this page's head, in other words
    for stage in pipeline:
        module = sys.modules.get(stage.run.__module__)
        out += [f"### {stage.name}", "",
                f"**Contract:** {_markdown(stage.contract)}. "
                f"**Group:** {'canonicalising' if stage.canonical else 'transform'}.", "",
                _markdown(_doc(stage.run)), "",
                f"Function `{stage.run.__module__}.{stage.run.__name__}`.", ""]
        doc = inspect.getdoc(module) if module is not None else None
        if doc and module.__name__ not in shown_modules:
            shown_modules.add(module.__name__)
            body = "\n".join("    " + line if line else "" for line in ["```text", *doc.splitlines(), "```"])
            out += [f'??? note "The module `{module.__name__}`"', "", body, ""]
    out += ["## simplify's rules", "",
            "`simplify` applies a table of local rewrite rules (`toolkit/passes/simplify.py`), tried in "
            "this order for each node of the op they match; the first that fires replaces the node's "
            "output. Each rule's docstring states its algebra, then where it must not fire.", "",
            "| rule | matches | what it does, and where it must not fire |", "| --- | --- | --- |"]
    for function, ops in rules:
        out.append(f"| `{function.__name__}` | {', '.join(f'`{op}`' for op in ops)} | {_cell(_doc(function))} |")
    out += ["", "## Switches a plan reads", "",
            "Names `--disable` takes that are no stage of the pipeline: the plan builder reads them.", "",
            "| switch | what it does |", "| --- | --- |"]
    out += [f"| `{switch.name}` | {_cell(switch.contract)} |" for switch in switches]
    out.append("")
    return "\n".join(out)


def on_files(files, config):
    """Adds the generated page to the build (it exists in site/ only)."""
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        content = passes_page()
    except DriftError as error:
        raise PluginError(str(error)) from None   # one clear message, not a traceback
    if files.get_file_from_path(PAGE) is not None:
        raise PluginError(f"docs/{PAGE} is generated when the site builds ({Path(__file__).name}); "
                          "remove the file (edit the passes' docstrings instead)")
    files.append(File.generated(config, PAGE, content=content))
    return files
