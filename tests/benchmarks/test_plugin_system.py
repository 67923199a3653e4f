"""The ``disc-plugin`` benchmark system: torch.compile(backend="disc") with compilations counted."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.systems.disc_system import PluginRunner


class Select(nn.Module):
    """A boolean-mask selection, as the detector workload has."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x[x.sum(-1) > 0]) * 2


def _run(capture: bool) -> tuple[int, list[torch.Tensor]]:
    torch._dynamo.reset()
    runner = PluginRunner(Select(), capture_selections=capture)
    g = torch.Generator().manual_seed(0)
    outs = []
    with torch.no_grad():
        for shape in [(5, 4), (9, 3), (7, 6)]:
            x = torch.randn(*shape, generator=g)
            got = runner(x)
            torch.testing.assert_close(got, Select()(x))
            outs.append(got)
    return runner.compilations, outs


def test_capturing_selections_keeps_one_graph_and_leaves_dynamo_config_alone() -> None:
    with_capture, _ = _run(True)
    assert with_capture == 1  # the selection stays in the graph: one compilation for all shapes
    assert not torch._dynamo.config.capture_dynamic_output_shape_ops  # set around the runner's calls only
    without, _ = _run(False)
    assert without > with_capture  # dynamo breaks the graph at nonzero: disc compiles the pieces
