"""A program for a GPU on inputs that mix devices as PyTorch allows: 0-d host tensors (a scale
kept as a buffer, the seeds an attention kernel returns) beside device tensors.

No GPU here: PyTorch's "meta" device stands in for one (tensors with shapes and no data), so
these check where tensors are placed, not values.
"""

import pytest
import torch

from disc.driver import example_device
from disc.errors import InputError
from disc.frontends.torch.importer import aligned_attention_bias
from disc.ir.parser import parse_graph
from disc.runtime.checks import InputChecker
from disc.runtime.reference import ReferenceExecutor

SCALED_RANGE = """
func @scaled_range(%s: f32[], %x: f32[n]) {
  sym n in [0, inf]  (test)
  %n = dim(%x) {axis=0} : index(n)
  %i = iota(%n) {dtype="f32"} : f32[n]
  %w = constant() {dtype="f32", ref="w", value=none} : f32[3]
  %sb = broadcast_in_dim(%s, %n) {dims=[]} : f32[n]
  %y = mul(%i, %sb) : f32[n]
  %z = add(%y, %x) : f32[n]
  return %z, %w
}
"""


def _graph():
    g = parse_graph(SCALED_RANGE)
    g.constants["w"] = torch.randn(3)
    return g


def test_the_program_runs_where_any_input_is_not_on_the_host():
    scalar, on_device = torch.tensor(2.0), torch.empty(4, device="meta")
    assert example_device([scalar, on_device]) == "meta"  # the host scalar first must not decide
    assert example_device([scalar, torch.randn(3)]) == "cpu"
    assert example_device([]) == "cpu"


def test_a_device_program_takes_0d_host_tensors_and_no_others():
    check = InputChecker(_graph(), ["s", "x"], "meta")
    for _ in range(2):  # the second call takes the remembered-shape path
        check([torch.tensor(2.0), torch.empty(5, device="meta")])
    with pytest.raises(InputError, match="input 'x' is on cpu; this program was compiled for meta"):
        check([torch.tensor(2.0), torch.randn(5)])
    host = InputChecker(_graph(), ["s", "x"], "cpu")
    with pytest.raises(InputError, match="input 's' is on meta"):
        host([torch.empty((), device="meta"), torch.randn(5)])


def test_the_reference_executor_keeps_every_tensor_on_the_inputs_device():
    # iota is made on the host and the payload is stored there: both must follow the inputs.
    z, w = ReferenceExecutor(_graph(), device="meta").run([torch.tensor(2.0), torch.empty(5, device="meta")])
    assert z.device.type == "meta" and z.shape == (5,)
    assert w.device.type == "meta"
    g = _graph()
    s, x = torch.tensor(2.0), torch.randn(5)
    z, w = ReferenceExecutor(g).run([s, x])
    torch.testing.assert_close(z, torch.arange(5.0) * 2 + x)
    assert w is g.constants["w"]


@pytest.mark.parametrize("dtype, align", [(torch.float32, 4), (torch.bfloat16, 8)])
@pytest.mark.parametrize("shape, broadcast", [((2, 4, 9, 9), False), ((2, 1, 9, 9), True), ((1, 1, 1, 1), True), ((3, 2, 5, 17), False)])
def test_an_attention_bias_is_laid_out_as_the_efficient_kernel_reads_it(dtype, align, shape, broadcast):
    bias = torch.randn(shape).to(dtype)
    if broadcast:
        bias = bias.expand(shape[0], 4, shape[2], shape[3])
    got = aligned_attention_bias(bias)
    assert torch.equal(got, bias)
    assert all(st % align == 0 for st in got.stride()[:-1])
    if broadcast and bias.shape[1] > 1:
        assert got.stride(1) == 0  # a broadcast head dim stays a view, not four copies
    if all(st % align == 0 for st in bias.stride()[:-1]):
        assert got is bias
