"""What the behaviour corpora after a hit (``test_behaviour_after_hit.py`` of the transformers and diffusers adapters,
``tests/test_sentence_transformers_after_hit.py``) observe of a loaded object, in the fresh processes they run:
each returns plain data, so a plain process and one that only hit can be compared with ``==``.

>>> logs = kept_logs("transformers")          # every record those loggers pass on, as [name, level, message]
>>> outcome(lambda: pickle.dumps(model))      # ["ok", value] or ["raised", exception class name]
>>> copies(model, forward)                    # pickle, torch.save and deepcopy, each used by forward
"""
from __future__ import annotations

import copy
import hashlib
import io
import logging
import pickle
import tempfile
from pathlib import Path
from typing import Any, Callable


def kept_logs(*loggers: str) -> list:
    """A list that receives ``[name, level, message]`` of every record the named loggers handle from now on."""
    logs: list = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logs.append([record.name, record.levelname, record.getMessage()])

    for name in loggers:
        logging.getLogger(name).addHandler(Keep())
    return logs


def outcome(fn: Callable[[], Any]) -> list:
    """``["ok", fn()]``, or ``["raised", its exception's class name]``: plain may raise, and a hit must raise alike."""
    try:
        return ["ok", fn()]
    except Exception as e:
        return ["raised", type(e).__name__]


def files_digest(folder: str | Path) -> dict[str, str]:
    """sha256 of every file under ``folder``, by its path relative to it."""
    root = Path(folder)
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def saved_pretrained(obj: Any) -> dict[str, str]:
    """:func:`files_digest` of what ``obj.save_pretrained`` writes."""
    with tempfile.TemporaryDirectory() as folder:
        obj.save_pretrained(folder)
        return files_digest(folder)


def copies(obj: Any, use: Callable[[Any], Any]) -> dict[str, list]:
    """pickle, torch.save and deepcopy of ``obj``, each used by ``use`` (a forward, an encoding, a pipeline call)."""
    import torch

    def saved() -> Any:
        buf = io.BytesIO()
        torch.save(obj, buf)
        buf.seek(0)
        return use(torch.load(buf, weights_only=False))

    return {"pickle": outcome(lambda: use(pickle.loads(pickle.dumps(obj)))), "torch.save": outcome(saved),
            "deepcopy": outcome(lambda: use(copy.deepcopy(obj)))}


def train_step(m: Any, loss_of: Callable[[Any], Any]) -> dict:
    """One SGD step of ``m`` on ``loss_of(m)``: the loss, every gradient and the weights after it, as digests."""
    import torch

    from . import tiny_models as tm

    torch.manual_seed(0)  # dropout draws
    m.train()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    opt.zero_grad()
    loss = loss_of(m)
    loss.backward()
    grads = {n: None if p.grad is None else tm.tensor_digest(p.grad) for n, p in sorted(m.named_parameters())}
    opt.step()
    m.eval()
    return {"loss": tm.tensor_digest(loss.detach()), "grads": grads, "weights": tm.state_digest(m)}
