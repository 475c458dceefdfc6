"""``InspectReport``: what ``inspect_checkpoint`` returns, its ``--json`` document and its text.

Its sections are the pipeline's records (``loadkit_inspect.inspector``): ``checkpoint``
(headers), ``mapper`` (every name traced through the rules), and with a model ``model``,
``probe``, ``load``, ``fix`` and ``tensor_parallel``. Each section's record renders its own JSON
and text; the report puts them in order, the loaders' headline first and the verdict last.
Torch-free: the header-only path builds one.
"""

from __future__ import annotations

import json
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from loadkit.checkpoint import DTYPES
from loadkit.errors import printable
from loadkit.fmt import plural
from loadkit_inspect.report.layout import LayoutNode, build_layout
from loadkit_inspect.report.probe import probe_as_dict, render_probe
from loadkit_inspect.report.summary import CheckpointSummary
from loadkit_inspect.report.text import joined_problems

if TYPE_CHECKING:
    from loadkit.pooling import ProbeRecord
    from loadkit_inspect.fixes.fix import NotOffered, SuggestedFix
    from loadkit_inspect.fixes.rename_fix import RenameFix
    from loadkit_inspect.loaders import LoaderVerdict
    from loadkit_inspect.mapper_trace import MapperReport
    from loadkit_inspect.report.records import LoadReport, ModelSummary
    from loadkit_inspect.simulate.from_pretrained import FromPretrained
    from loadkit_inspect.tensor_parallel.plan import TPReport

SCHEMA_VERSION = 8  # docs/inspect.md, "The --json document", says what each version added
# A checkpoint tensor as build_layout takes it (made in C: a large checkpoint has 100,000s).
_ITEM = attrgetter("name", "nbytes", "dtype", "shape")


# Where the two loaders' disagreement is explained (one load clean, the other not).
FIDELITY_POINTER = [
    "(the loaders disagree: where and why, architecture by architecture, from each loader's code:",
    ' docs/fidelity.md, "Where the two loaders differ")',
]


class InspectReport:
    """The report: ``checkpoint`` (headers), and with a model ``model``, ``probe``, ``load``;
    ``mapper`` whenever a mapper is involved. ``render()`` is the CLI's text, ``to_json()`` its
    ``--json`` document."""

    def __init__(
        self,
        checkpoint: CheckpointSummary,
        *,
        mapper: MapperReport | None = None,
        model: ModelSummary | None = None,
        probe: dict[str, ProbeRecord] | None = None,
        load: LoadReport | None = None,
        tensor_parallel: TPReport | None = None,
        fix: SuggestedFix | None = None,
        strict_index: bool = False,
        loaders: dict[str, LoaderVerdict] | None = None,
        selected_loaders: tuple[str, ...] = ("vllm",),
        from_pretrained: FromPretrained | None = None,
        not_offered: NotOffered | None = None,
        rename_fix: RenameFix | None = None,
    ) -> None:
        self.checkpoint = checkpoint
        self.mapper = mapper
        self.model = model
        self.probe = probe
        self.load = load
        self.tensor_parallel = tensor_parallel
        self.fix = fix  # mapper rules that fix a systematic mismatch, proven
        self.strict_index = strict_index  # an inconsistent index fails (exit 1)
        # One verdict per loader ("vllm", and "transformers" for --model hf), those selected by
        # --loader deciding ``clean``; ``from_pretrained``: the transformers loader's lists.
        self.loaders = loaders
        self.selected_loaders = selected_loaders
        self.from_pretrained = from_pretrained
        # Rules the suggester considered and refused when it offers no fix (with a fix, its
        # own ``rejected`` holds them).
        self.not_offered = not_offered
        # the fix for the loader that takes no mapper: loadkit rename, proven on both loaders
        self.rename_fix = rename_fix
        self._layouts: dict[bool, LayoutNode] = {}  # built on first use

    def __repr__(self) -> str:
        c = self.checkpoint
        return f"<InspectReport {c.path}: {len(c.tensors)} tensors, clean={self.clean}>"

    def _layout(self, fold: bool) -> LayoutNode:
        if fold not in self._layouts:
            items = map(_ITEM, self.checkpoint.tensors)
            self._layouts[fold] = build_layout(items, fold=fold)
        return self._layouts[fold]

    @property
    def layout(self) -> LayoutNode:
        """The key tree, one node per dotted prefix (built on first use)."""
        return self._layout(False)

    @property
    def folded_layout(self) -> LayoutNode:
        """The key tree with numbered siblings merged (``layers.{0-27}``): the report's view."""
        return self._layout(True)

    @property
    def clean(self) -> bool | None:
        """Would every selected loader load the checkpoint cleanly, ``--tp`` and
        ``--strict-index`` included? ``False`` exactly when ``exit_status`` is 1; ``None``
        without a model (``load.clean`` is the dry load's alone)."""
        if self.loaders:  # vLLM's load is not simulated where its class is not modelled
            return all(self.loaders[n].clean for n in self.selected_loaders)
        if self.load is None:
            return None
        tp_ok = self.tensor_parallel is None or self.tensor_parallel.ok
        return self.load.clean and not self.checkpoint.failing and not self._strict_fails and tp_ok

    @property
    def labelled(self) -> bool:
        """Does a loader's verdict name the class it uses (``--model hf``: the class vLLM would
        use)? Then that verdict, not the dry load's counts, is what the report concludes."""
        return any(v.via for v in (self.loaders or {}).values())

    @property
    def _strict_fails(self) -> bool:
        return self.strict_index and bool(self.checkpoint.inconsistent)

    @property
    def exit_status(self) -> int:
        """0: loads cleanly by every selected loader (or, without a model, every tensor the
        index names can be read), an inconsistent index included (a key in another shard than
        it says, one it does not list, a wrong ``total_size``); 1: it would not (``clean`` is
        ``False``: a loader's problem, a tensor that cannot be read, with ``strict_index`` an
        inconsistent index, with ``tp`` vLLM's refusal or a rank that cannot hold it)."""
        if self.clean is None:
            return 1 if self.checkpoint.failing or self._strict_fails else 0
        return 0 if self.clean else 1

    def problems(self) -> list[str]:
        """Short descriptions of what keeps the checkpoint from loading cleanly: with several
        selected loaders each one's verdict, named; else the index's, the load's and (for
        ``vllm``) what ``--tp`` found."""
        if self.loaders and (len(self.selected_loaders) > 1 or self.labelled):
            chosen = [self.loaders[n] for n in self.selected_loaders]
            return [f"{v.label}: {p}" for v in chosen for p in v.problems]
        out = []
        if self.checkpoint.failing:
            n = len(self.checkpoint.failing)
            what = "index problem" if self.checkpoint.index else "file problem"
            out.append(f"{plural(n, what)} that {'stops' if n == 1 else 'stop'} the load")
        if self._strict_fails:
            n = len(self.checkpoint.inconsistent)
            out.append(
                f"{plural(n, 'index inconsistency', 'index inconsistencies')} under --strict-index"
            )
        if self.load is not None and "vllm" in self.selected_loaders:
            out += self.load.problems()
            out += self.tensor_parallel.problems() if self.tensor_parallel is not None else []
        if self.from_pretrained is not None and "transformers" in self.selected_loaders:
            out += self.from_pretrained.problems()
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "checkpoint": self.checkpoint.as_dict(),
            "layout": self.folded_layout.as_dict(),
            "mapper": self.mapper.as_dict() if self.mapper else None,
            "model": self.model.as_dict() if self.model else None,
            "probe": probe_as_dict(self.probe) if self.probe else None,
            "load": self.load.as_dict() if self.load else None,
            "tensor_parallel": self.tensor_parallel.as_dict() if self.tensor_parallel else None,
            "suggested_fix": self.fix.as_dict() if self.fix else None,
            "not_offered": self.not_offered.as_list() if self.not_offered else [],
            "rename_fix": self.rename_fix.as_dict() if self.rename_fix else None,
            "loaders": {n: v.as_dict() for n, v in self.loaders.items()} if self.loaders else None,
            "selected_loaders": list(self.selected_loaders),
            "transformers": self.from_pretrained.as_dict() if self.from_pretrained else None,
            "clean": self.clean,
            "exit_status": self.exit_status,
        }

    def to_json(self, indent: int | None = None) -> str:
        """One JSON document; one line by default (json's C encoder: indenting runs in Python
        and costs more than the whole header parse of a 2000-name checkpoint)."""
        return json.dumps(self.as_dict(), indent=indent)

    def render(self, *, limit: int = 20, max_depth: int | None = None) -> str:
        """The report as text: the sections in order, each list capped at ``limit`` rows."""
        lines: list[str] = []
        head = self._headline()
        if head is not None:  # which loaders would load it, before anything else
            lines += [head, *self._disagreement(), ""]
        if self.fix is not None:  # the answer first: the rule that fixes the load
            lines += [*self.fix.render(limit), ""]
        elif self.not_offered is not None:  # or the rules considered, and why none is offered
            lines += [*self.not_offered.render(limit), ""]
        if self.rename_fix is not None:  # the fix for transformers, which takes no mapper
            lines += [*self.rename_fix.render(limit), ""]
        lines += self.checkpoint.render(limit)
        lines += ["", *self.folded_layout.section(limit, max_depth)]
        if self.mapper is not None:
            lines += ["", *self.mapper.render(limit)]
        if self.model is not None:
            lines += ["", *self.model.render()]
        if self.probe is not None:
            lines += ["", *render_probe(self.probe)]
        if self.load is not None and self.model is not None:
            # With two loaders this section is vLLM's: say so (the transformers one follows).
            lines += ["", *self._load_lines(limit, "vllm loader: " if head is not None else "")]
        elif self.model is not None and self._unchecked is not None:
            label = self._unchecked.label
            lines += ["", f"load  (vllm loader): not simulated ({label}: not checked)"]
        if self.from_pretrained is not None:
            verdict = (self.loaders or {}).get("transformers")
            said = verdict.phrase() if verdict is not None else None
            lines += ["", *self.from_pretrained.render(limit, said)]
        if self.tensor_parallel is not None:
            lines += ["", *(printable(line) for line in self.tensor_parallel.render(limit))]
        return "\n".join([*lines, "", *self._warnings(), *self._final_verdict(head)])

    @property
    def _unchecked(self) -> LoaderVerdict | None:
        """The ``vllm`` verdict, where it was not checked (no load of vLLM's class simulated)."""
        vllm = (self.loaders or {}).get("vllm")
        return vllm if vllm is not None and not vllm.checked else None

    def _load_lines(self, limit: int, loader: str) -> list[str]:
        from loadkit_inspect.report.records import render_load  # a model's report only

        assert self.load is not None
        dtypes = self.checkpoint.dtypes
        major = max(dtypes, key=lambda d: dtypes[d][0]) if dtypes else None
        fix = self.fix
        return render_load(
            self.load,
            limit,
            explained_keys=fix.explained_keys() if fix else (),
            explained_tensors=fix.explained_tensors() if fix else (),
            majority=(DTYPES[major][0] if major in DTYPES else major) if major else None,
            loader=loader,
        )

    @property
    def stated_verdicts(self) -> list[LoaderVerdict]:
        """The verdicts the report states first and last: every selected loader's, and a
        loader's that was not checked (it says why)."""
        loaders = (self.loaders or {}).items()
        return [v for n, v in loaders if n in self.selected_loaders or not v.checked]

    def _headline(self) -> str | None:
        """Every selected loader's verdict side by side, for a model with more than one loader
        (one line per loader when they do not fit on one)."""
        if not self.loaders or (len(self.loaders) < 2 and not self.labelled):
            return None
        from loadkit.fmt import WIDTH, wrap
        from loadkit_inspect.loaders import headline

        verdicts = self.stated_verdicts
        line = printable(headline(verdicts))
        if len(line) + len("verdict: ") <= WIDTH:
            return line
        return "\n".join(wrap(printable(v.phrase())) for v in verdicts)

    def _disagreement(self) -> list[str]:
        """A pointer to the page that explains, architecture by architecture, why the two
        loads disagree: one loader's load is clean, the other's is not (a refusal of ``--tp`` or
        of the index is said where it is found, not there)."""
        both = {"vllm", "transformers"} <= set(self.selected_loaders)
        tf, vllm = ((self.loaders or {}).get(n) for n in ("transformers", "vllm"))
        if not both or tf is None or vllm is None or self.load is None:
            return []
        if tf.clean == vllm.clean or tf.clean == self.load.clean:  # both fail, or both load
            return []
        return FIDELITY_POINTER

    def _warnings(self) -> list[str]:
        """Patterns of the load rules that matched nothing: said last, by the verdict they
        leave unchanged."""
        unmatched = self.load.unmatched_patterns if self.load is not None else []
        return [f"warning: {printable(u.message())}" for u in unmatched]

    def _final_verdict(self, head: str | None) -> list[str]:
        """The last line(s): the verdict and the exit status; ``head``: the loaders' headline."""
        inconsistent = len(self.checkpoint.inconsistent)
        strict = self.strict_index and inconsistent
        index = ""
        if inconsistent and not strict and not self.checkpoint.failing:
            index = (
                f"; the index is inconsistent ({plural(inconsistent, 'problem')} above; loaders "
                "read the files it names, not its list of keys)"
                if self.checkpoint.index
                else f"; the files are inconsistent ({plural(inconsistent, 'problem')} above; "
                "loaders read every copy of a key, the last one stays)"
            )
        if self.clean is None and (self.checkpoint.failing or strict):
            disagree = (
                "the index disagrees with its shards"
                if self.checkpoint.index
                else "the files cannot all be read"
            )
            return [
                f"verdict: {disagree}: {joined_problems(self.problems())}; no model given, so "
                "names were not matched (exit 1)"
            ]
        if self.clean is None:
            return [
                f"verdict: headers valid{index}; no model given, so names were not matched (exit 0)"
            ]
        if head is not None or self.clean:  # each loader's column says its own problems
            return self._loads(head, index)
        label = self._label()
        lines = [f"verdict: {label}would NOT load: {joined_problems(self.problems())} (exit 1)"]
        if self.fix is not None and self.fix.proven:
            lines.append("         (it would load cleanly with the suggested fix, at the top)")
        return lines

    def _loads(self, head: str | None, index: str) -> list[str]:
        """The verdict when the selected loaders say it loads (or, with ``head``, each
        loader's)."""
        tp = self.tensor_parallel
        where = ""
        if tp is not None and not tp.ok:  # vLLM's refusal: its column says it
            pass
        elif tp is not None and tp.simulated:
            where = f" on each of {tp.tp} ranks"
        elif tp is not None:  # nothing was loaded per rank: say what was checked
            where = (
                f" (tp={tp.tp}: the config's head counts and vocabulary split checked; "
                "no rank simulated)"
            )
        if head is None:
            return [f"verdict: {self._label()}would load cleanly{where}{index} (exit 0)"]
        status = f"(exit {0 if self.clean else 1})"
        said = f"{where}{index}".removeprefix("; ").strip()
        if "\n" in head:  # one loader a line, under the word "verdict"
            rows = [*("  " + row for row in head.splitlines()), f"  {said} {status}".rstrip()]
            return ["verdict:", *rows] if said else ["verdict:", *rows[:-1], f"  {status}"]
        return [f"verdict: {head}{where}{index} {status}"]

    def _label(self) -> str:
        """The one selected loader and its version, before its verdict: ``vllm 0.34.0: ``."""
        if self.loaders and len(self.selected_loaders) == 1:
            return f"{self.loaders[self.selected_loaders[0]].label}: "
        return ""

    def __str__(self) -> str:
        return self.render()
