"""The report's sections the others share: ``summary`` (the checkpoint), ``layout`` (the key
layout), ``records`` (the model and the load), ``probe`` (the pooling probe), ``text`` (what
their text shares)."""

from loadkit_inspect.report.layout import LayoutNode, build_layout

__all__ = ["LayoutNode", "build_layout"]
