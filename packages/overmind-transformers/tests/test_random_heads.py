"""A model whose checkpoint lacks a head draws that head from torch's global generator: never served from the
cache (``overmind/loading/randomness.py``).

``BertForSequenceClassification.from_pretrained`` on a base BERT checkpoint initialises the classifier at random.
Plain, its values follow the seed the user set, and the generator ends further on. Each process here seeds,
loads through the activated adapters and reports the model's digest and the generator's next draws; every one
must be what a plain process with the same seed reports, the second process with that seed included (a hit would
give the first's head, and leave the generator behind).
"""
from __future__ import annotations

import pytest

SCRIPT = '''
from transformers import BertForSequenceClassification

if os.environ["ACTIVE"] == "1":
    overmind.activate()
torch.manual_seed(int(os.environ["SEED"]))
model = BertForSequenceClassification.from_pretrained(P["bert"], num_labels=3)
report({"state": tm.state_digest(model), "next": torch.rand(4).tolist(), "class": type(model).__name__})
'''


@pytest.mark.long(100)  # seconds on a CI machine: conftest.py runs it early
def test_a_randomly_initialised_head_follows_the_seed_in_every_process(fresh):
    plain = {seed: fresh(SCRIPT, ACTIVE="0", SEED=str(seed)) for seed in (1, 2)}
    assert plain[1]["state"] != plain[2]["state"]  # the head does depend on the seed
    for seed in (1, 1, 2, 1):
        assert fresh(SCRIPT, ACTIVE="1", SEED=str(seed)) == plain[seed], seed
