from hypothesis import settings

# `make test`: the same examples on every run, so CI failures reproduce.
settings.register_profile("loadkit", derandomize=True, deadline=None)
# `make test-deep` (pytest --hypothesis-profile=deep -m hypothesis): random seeds and ten times
# the examples. Tests that scale their example count read settings.default.max_examples.
settings.register_profile("deep", derandomize=False, deadline=None, max_examples=1000)
settings.load_profile("loadkit")
