"""transformers logs some notices once per process (``logger.warning_once``): a hit must show them as often as
the plain calls would, in a process that loads twice and in one that loads once (``overmind/loading/replay/loader_logs.py``).

transformers 4.x warns "`torch_dtype` is deprecated!" once from ``from_pretrained``; 5.x warns it once when a
config's ``torch_dtype`` is read. Each process loads a BERT twice and reads a config's ``torch_dtype`` twice
through ``overmind.load``, recording every record the ``transformers`` loggers hand on; the cold and the warm
processes must record what the plain process records, and the warm one must be served from the cache.
"""
from __future__ import annotations

import pytest

SCRIPT = '''
import logging
from transformers import AutoConfig, BertModel

records = []

class Keep(logging.Handler):
    def emit(self, record):
        records.append([record.name, record.levelno, record.getMessage(), os.path.basename(record.pathname),
                        record.lineno, record.funcName])

logging.getLogger("transformers").addHandler(Keep())
active = os.environ["ACTIVE"] == "1"
if active:
    overmind.activate()


def dtype_of(path):
    return str(AutoConfig.from_pretrained(path).torch_dtype)


load = overmind.load if active else (lambda fn, *a: fn(*a))
for _ in range(2):
    model = BertModel.from_pretrained(P["bert"], torch_dtype=torch.float32)
    records.append(["loaded", load(dtype_of, P["bert"])])
hits = sum(e.hits for e in overmind.cache_info(processes=False).entries) if active else 0
report({"records": records, "hits": hits})
'''


@pytest.mark.long(48)  # seconds on a CI machine: conftest.py runs it early
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_once_only_notices_show_as_in_plain(fresh):
    plain = fresh(SCRIPT, ACTIVE="0")
    once = [tuple(r[:3]) for r in plain["records"] if "deprecated" in str(r)]
    assert once and len(once) == len(set(once)), plain  # once-only notices: each shown by the first call alone
    cold = fresh(SCRIPT, ACTIVE="1")
    warm = fresh(SCRIPT, ACTIVE="1")
    assert cold["records"] == plain["records"]
    assert warm["records"] == plain["records"]
    assert warm["hits"] > cold["hits"], "the warm process is served from the cache"
