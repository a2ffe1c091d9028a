"""The plain PyTorch pattern in a process that never seeds: ``net = Net(); net.load_state_dict(torch.load(path))``,
a network of about 100M parameters (24 linear layers of 2048 x 2048, 0.4 GB in float32) built at random, then
overwritten by its checkpoint, through ``overmind.load`` (plain: called directly).

    python benchmarks/scenarios/pytorch_net.py CKPT

Overmind mode imports and activates ``overmind`` before torch, as a program that never seeds must for the load to
be served (``docs/adapters.md``).
"""
import time

_t_process = time.perf_counter()
import os  # noqa: E402
import sys  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "harness"))
sys.path.insert(0, HERE)
import child  # noqa: E402

sw = child.Stopwatch()
with sw("overmind_setup"):
    facts = child.start(breakdown_now=False)
with sw("import"):
    import net_model
    import torch
child.install_breakdown()

ckpt = sys.argv[1]
with sw("load"):
    if child.MODE == "plain":
        net = net_model.load_net(ckpt)
    else:
        import overmind

        net = overmind.load(net_model.load_net, ckpt)
child.emit(**facts, times=sw.times, weight_bytes=child.weight_bytes(net), unseeded=torch.initial_seed() >= 2**32,
           python_s=time.perf_counter() - _t_process)
