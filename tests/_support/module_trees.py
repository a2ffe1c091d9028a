"""Generated torch module trees with every kind of content the provenance walk reads (nesting, a module shared between
places, cycles, ``None`` children and parameters, buffers, tensor attributes of plain and subclassed tensors,
``OrderedDict`` containers reordered with ``move_to_end``, hooks, ``training`` flags, views with odd strides and
offsets, conjugate and negative views, gradients, meta tensors, empty storages), for hypothesis tests.
"""
from __future__ import annotations

import collections

import torch
from hypothesis import strategies as st


class Sub(torch.Tensor):
    pass


class Plain:
    pass


def _tensor(draw, kind: str) -> torch.Tensor:
    dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.complex64, torch.int64]))
    n = draw(st.integers(0, 12))
    base = torch.zeros(n + 4, dtype=dtype)
    view = draw(st.sampled_from(["whole", "offset", "strided", "conj", "neg", "meta", "empty"]))
    if view == "offset":
        t = base[draw(st.integers(0, 3)):]
    elif view == "strided":
        t = base.as_strided((max(1, n // 2), 2), (2, 1), draw(st.integers(0, 1)))
    elif view == "conj" and dtype.is_complex:
        t = base.conj()
    elif view == "neg" and dtype.is_complex:
        t = base.conj()._neg_view() if hasattr(base, "_neg_view") else base
    elif view == "meta":
        t = torch.empty(n, dtype=dtype, device="meta")
    elif view == "empty":
        t = torch.empty(0, dtype=dtype)
    else:
        t = base
    if kind == "parameter":
        p = torch.nn.Parameter(t.detach().clone() if t.is_neg() or t.is_conj() else t.detach(),
                               requires_grad=dtype.is_floating_point and draw(st.booleans()))
        if p.requires_grad and draw(st.booleans()):
            p.grad = torch.zeros_like(p)
        return p
    if kind == "subclass":
        return t.as_subclass(Sub)
    return t


@st.composite
def trees(draw):
    """A module tree with every kind of content the walk reads, and sometimes a shared child or a cycle."""
    made: list[torch.nn.Module] = []

    def module(depth: int) -> torch.nn.Module:
        m = torch.nn.Module()
        made.append(m)
        if draw(st.booleans()):
            m._parameters = collections.OrderedDict()
        for i in range(draw(st.integers(0, 3))):
            m._parameters[f"p{i}"] = None if draw(st.integers(0, 5)) == 0 else _tensor(draw, "parameter")
        for i in range(draw(st.integers(0, 2))):
            m._buffers[f"b{i}"] = None if draw(st.integers(0, 5)) == 0 else _tensor(draw, "plain")
        for i in range(draw(st.integers(0, 2))):
            setattr(m, f"a{i}", draw(st.sampled_from([1, "x", None, 2.5, (1, 2), Plain()])))
        if draw(st.integers(0, 3)) == 0:
            object.__setattr__(m, "loose", _tensor(draw, draw(st.sampled_from(["plain", "subclass"]))))
        m.training = draw(st.booleans())
        for _ in range(draw(st.integers(0, 2))):
            m.register_forward_hook(lambda *a: None)
        if draw(st.booleans()):
            m.register_forward_pre_hook(lambda *a: None)
        if depth < 3:
            for i in range(draw(st.integers(0, 3))):
                choice = draw(st.integers(0, 9))
                if choice == 0:
                    m._modules[f"c{i}"] = None
                elif choice == 1 and made:
                    m._modules[f"c{i}"] = draw(st.sampled_from(made))  # shared, or a cycle back up
                else:
                    m._modules[f"c{i}"] = module(depth + 1)
        if isinstance(m._parameters, collections.OrderedDict) and len(m._parameters) > 1 and draw(st.booleans()):
            m._parameters.move_to_end(next(iter(m._parameters)))  # its own order is not its dict's order
        return m

    return module(0)
