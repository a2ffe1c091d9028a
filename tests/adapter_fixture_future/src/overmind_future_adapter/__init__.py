"""Never imported: its declared requirement (torch>=99) is unmet."""
raise AssertionError("overmind imported an adapter whose requirements are unmet")
