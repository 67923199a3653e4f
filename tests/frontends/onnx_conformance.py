"""ONNX's own backend test suite run against ``disc.frontends.onnx.backend``, classified.

    python tests/frontends/onnx_conformance.py [--write docs/onnx-conformance.md] [--without-torch]

Each case ends one of four ways: **ok** (outputs within the suite's tolerances), **refused**
(a ``CompileError`` naming what disc does not take, raised before anything runs), **wrong**
(outputs differ) or **crash** (any other exception). A conformant frontend has no wrong and no
crash; ``test_onnx_conformance.py`` holds CI to that and to the ok counts below.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import time
import unittest
from dataclasses import dataclass, field

CATEGORIES = {
    "node": "OnnxBackendNodeModelTest",
    "simple": "OnnxBackendSimpleModelTest",
    "pytorch-converted": "OnnxBackendPyTorchConvertedModelTest",
    "pytorch-operator": "OnnxBackendPyTorchOperatorModelTest",
    "light models": "OnnxBackendRealModelTest",
}


@dataclass
class Outcome:
    ok: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # test -> reason
    wrong: dict[str, str] = field(default_factory=dict)
    crash: dict[str, str] = field(default_factory=dict)


class _Collect(unittest.TestResult):
    def __init__(self, outcome: Outcome) -> None:
        super().__init__()
        self.outcome = outcome

    @staticmethod
    def _name(test: unittest.TestCase) -> str:
        return test.id().rsplit(".", 1)[-1].removesuffix("_cpu")

    def addSuccess(self, test):  # noqa: N802 (unittest's names)
        self.outcome.ok.append(self._name(test))

    def addFailure(self, test, err):  # noqa: N802
        self.outcome.wrong[self._name(test)] = str(err[1]).strip().splitlines()[-1][:200]

    def addError(self, test, err):  # noqa: N802
        from disc.errors import CompileError

        text = str(err[1]).strip().splitlines()[-1] if str(err[1]).strip() else type(err[1]).__name__
        if isinstance(err[1], CompileError):
            self.outcome.refused[self._name(test)] = text
        else:
            self.outcome.crash[self._name(test)] = f"{type(err[1]).__name__}: {text}"[:200]


def run(category: str, names: str = ".") -> Outcome:
    """Run the CPU cases of ``category`` whose names match the regex ``names``."""
    import onnx.backend.test
    from onnx_node_data import ensure

    from disc.frontends.onnx.backend import DiscBackend

    if category == "node":
        ensure()
    suite = onnx.backend.test.BackendTest(DiscBackend, __name__)
    suite.include(r"_cpu$")
    outcome = Outcome()
    tests = unittest.TestSuite()
    cases = suite.test_cases[CATEGORIES[category]]
    for test in unittest.defaultTestLoader.loadTestsFromTestCase(cases):
        if re.search(names, test.id().rsplit(".", 1)[-1]) and test.id().endswith("_cpu"):
            tests.addTest(test)
    tests.run(_Collect(outcome))
    return outcome


def reason_of(text: str) -> str:
    """A refusal's reason without the node's name (so cases group by reason)."""
    text = re.sub(r"^node \S+ \(", "(", text)
    text = re.sub(r" \(supported: .*", "", text)
    return re.sub(r"input '[^']*'", "an input", text)


def report(outcomes: dict[str, Outcome], seconds: float) -> str:
    lines = ["| category | cases | ok | refused (clear error) | wrong | crash |", "|---|---:|---:|---:|---:|---:|"]
    for name, o in outcomes.items():
        total = len(o.ok) + len(o.refused) + len(o.wrong) + len(o.crash)
        lines.append(f"| {name} | {total} | {len(o.ok)} | {len(o.refused)} | {len(o.wrong)} | {len(o.crash)} |")
    lines += ["", f"({seconds:.0f} s on this machine.)", "", "Refused, by reason (cases):", ""]
    reasons: dict[str, list[str]] = collections.defaultdict(list)
    for o in outcomes.values():
        for test, why in o.refused.items():
            reasons[reason_of(why)].append(test)
    for why, tests in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"- {why} ({len(tests)}): {', '.join(t.removeprefix('test_') for t in sorted(tests))}")
    for kind in ("wrong", "crash"):
        for o in outcomes.values():
            for test, why in getattr(o, kind).items():
                lines.append(f"- **{kind}**: {test}: {why}")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", help="write the report (markdown) here")
    p.add_argument("--without-torch", action="store_true", help="run as where PyTorch is not installed (the native program through disc_runtime)")
    args = p.parse_args()
    if args.without_torch:
        sys.modules["torch"] = None  # type: ignore[assignment]  # any `import torch` now fails
    start = time.perf_counter()
    outcomes = {name: run(name) for name in CATEGORIES}
    text = report(outcomes, time.perf_counter() - start)
    print(text)
    if args.write:
        with open(args.write, "w") as f:
            f.write("# ONNX backend test suite\n\n" + (__doc__ or "").split("\n\n", 2)[2] + "\n" + text)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, __import__("os").path.dirname(__file__))
    raise SystemExit(main())
