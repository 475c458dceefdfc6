"""``loadkit inspect``: a checkpoint checked against a model before any load.

Torch-free, so that a header-only inspect of a 100 GB checkpoint starts in milliseconds:
``summary`` and ``records`` (what a report holds), ``render`` (its text), ``layout`` (the prefix
tree of names), ``inspector`` (``inspect_checkpoint``) and ``cli``. The two exceptions import
torch and are imported only when asked for: ``simulate``, the load simulated on the meta device
(``--model``), and ``tensor_parallel``, every rank's share simulated likewise (``--tp``).
``tests/test_architecture.py`` enforces the rule.
"""
