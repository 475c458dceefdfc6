"""Hypothesis profiles for the property tests (the tests using ``@given``).

- ``loadkit`` (loaded by default; ``make test`` and CI): derandomized, the same examples on every
  run, so a failure in CI reproduces anywhere.
- ``deep`` (``make test-deep``, i.e. ``pytest --hypothesis-profile=deep -m hypothesis tests``):
  random seeds and ten times the examples. A failure prints the falsifying example and a
  ``@reproduce_failure`` blob; ``--hypothesis-seed=N`` replays a whole run.

A test that sets its own ``max_examples`` scales it from ``settings().max_examples`` (the loaded
profile's), so the deep profile multiplies it too.
"""

from hypothesis import settings

EXAMPLES = 100
DEEP_FACTOR = 10

settings.register_profile("loadkit", derandomize=True, deadline=None, max_examples=EXAMPLES)
settings.register_profile(
    "deep",
    derandomize=False,
    deadline=None,
    max_examples=DEEP_FACTOR * EXAMPLES,
    print_blob=True,
)
settings.load_profile("loadkit")  # hypothesis' --hypothesis-profile option loads after this
