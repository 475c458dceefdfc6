"""``loadkit inspect``: a checkpoint checked against a model before any load.

Torch-free, so that a header-only inspect of a 100 GB checkpoint starts in milliseconds:
``records`` (what a report holds), ``render`` (its text), ``layout`` (the prefix tree of names),
``inspector`` (``inspect_checkpoint``) and ``cli``. The one exception is ``simulate``, the load
simulated on the meta device, which imports torch and is imported only when ``--model`` is given.
``tests/test_architecture.py`` enforces the rule.
"""
