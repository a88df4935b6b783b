"""The matcher toolkit on captured Dynamo graphs: operation kinds, layout-preserving walks,
module paths, and the post-dominator proof that a region's intermediates do not escape."""
import torch

from compiler.passes.matcher import (escaping_nodes, module_path, op_kind, post_dominators,
                                     skip_layout_preserving)


def capture(fn, *args):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend)(*args)
    return graphs[0].graph


def _node(graph, kind):
    (n,) = [n for n in graph.nodes if op_kind(n) == kind]
    return n


def test_spellings_share_one_kind():
    graph = capture(lambda x: torch.relu(x) + torch.nn.functional.relu(x) + x.relu() + x.clamp_min(0), torch.ones(3))
    assert [op_kind(n) for n in graph.nodes if n.op.startswith("call")].count("relu") == 3


def test_walk_skips_unit_dim_views_clones_and_widening_casts():
    graph = capture(lambda x: torch.topk(x.unsqueeze(1).clone().float().squeeze(1).contiguous(), 2),
                    torch.ones(3, 4, dtype=torch.bfloat16))
    top = _node(graph, "topk")
    src, skipped = skip_layout_preserving(top.args[0])
    assert src.op == "placeholder" and len(skipped) == 5


def test_walk_stops_at_transpose_and_narrowing_cast():
    graph = capture(lambda x: torch.topk(x.transpose(0, 1).contiguous(), 2), torch.ones(3, 4))
    assert op_kind(skip_layout_preserving(_node(graph, "topk").args[0])[0]) == "transpose"
    graph = capture(lambda x: torch.topk(x.half(), 2), torch.ones(3, 4))
    assert op_kind(skip_layout_preserving(_node(graph, "topk").args[0])[0]) == "cast"


def test_walk_stops_at_a_reshape_that_moves_non_unit_dims():
    graph = capture(lambda x: torch.topk(x.reshape(4, 3), 2), torch.ones(3, 4))
    assert op_kind(skip_layout_preserving(_node(graph, "topk").args[0])[0]) == "reshape"


def test_escaping_intermediate_is_found_by_post_dominators():
    def closed(x):
        return torch.topk(x.sin() * 2, 2).indices

    def leaky(x):
        y = x.sin()
        return torch.topk(y * 2, 2).indices, y.sum()

    for fn, expect in ((closed, []), (leaky, ["sin"])):
        graph = capture(fn, torch.ones(3, 4))
        top = _node(graph, "topk")
        interior = [top, _node(graph, "mul"), *[n for n in graph.nodes if n.target == "sin"]]
        names = [n.target for n in escaping_nodes(post_dominators(graph), interior, top)]
        assert names == expect


class Inner(torch.nn.Module):
    def forward(self, x):
        return torch.topk(x, 2).indices


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([Inner()])

    def forward(self, x):
        return self.layers[0](x)


def test_module_path_is_the_innermost_module():
    graph = capture(Outer(), torch.ones(3, 4))
    assert module_path(_node(graph, "topk")) == "layers.0"
